"""How a pack's ranges run: ``ray`` (``--engine ray``: the driver, Ray tasks packing
contiguous ranges) and ``ranges`` (its ranges, shard names and done-markers in DST)."""
