"""The packer's listed sources: what to pack from a folder, a file list or COCO
annotations, listed up front (:mod:`packer.sources.folders`)."""
