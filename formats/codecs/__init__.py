"""Foreign formats as codecs (a source and a sink each: TFRecord, WebDataset, Parquet, MDS, image folders, our shards) and the registry that names them."""
