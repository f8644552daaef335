"""Our shard format (FORMAT.md): layout, manifest, shard reading and writing, datasets, verification, and which files are ours."""
