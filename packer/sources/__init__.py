"""The packer's listed sources: what to pack from a folder, a file list or COCO
annotations, listed up front as a :class:`~packer.sources.listing.Listing`.

``listing`` (the Listing and the rules every listing follows), ``folders`` (image
folders and folders of files, local or on object storage), ``filelist`` (CSV, TSV
and JSONL lists, local or on object storage), ``columns`` (typing a list's
columns), ``anyfiles`` (folders of any files, fields by extension) and ``coco``
(COCO detection annotations). Which one SRC is, and the container formats beside
them, is :mod:`packer.resolve`'s business.
"""
