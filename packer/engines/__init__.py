"""How a pack's ranges run: ``driver`` (a pack cut into ranges, each packed by the
local pack loop, finished by one manifest), ``ranges`` (their shard names,
done-markers and state in DST), ``local`` (ranges in forked worker processes) and
``ray`` (ranges as Ray tasks; the only module that imports Ray)."""
