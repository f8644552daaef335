"""``pack-dataset SRC DST [options]``: a thin adapter over :func:`packer.pack`.

Exit status: 0 success, 1 a data or IO error (the message names the file and
the reason), 2 bad usage, 130 interrupted (finished shards kept; ``--resume``).
Usage is what the command line says by itself (a wrong flag, a bad option value,
options that contradict each other, a URI that cannot be parsed): the usage block,
then the message. What is found by looking at SRC or DST (DST holding other files,
SRC not what ``--from`` reads, an option that does not fit what SRC holds) is a
data error: one line, status 1.
"""

from __future__ import annotations

import argparse
import errno
import json
import shlex
import sys

from formats.errors import ShardpackError, URIError
from formats.media import MAX_PIXELS
from formats.version import package_version

from .errors import PackInputError, PackInterrupted, UsageError
from .options import DEFAULT_TASK_RECORDS, ENGINES, ON_ERROR, PackOptions, parse_size
from .report import TqdmProgress, format_summary, interrupted_text
from .run import pack

__all__ = ["main"]

_EPILOG = """\
sources (--from; detected when omitted):
  imagefolder  SRC/<class>/**/<file>; label = index of the sorted class name;
               files directly in SRC are ignored; an empty class keeps its label;
               a classes.json in SRC (as --to imagefolder writes it) names the
               classes and must match the folders
  files        every file under SRC, recursively; no label
  filelist     a .csv/.tsv/.jsonl file with a 'path' column (relative to the
               list's folder; absolute and '..' paths allowed: it is your own
               list); other columns become int/float/str fields, typed on every
               row (a CSV/TSV cell is a number only as plain decimal: 007, +5
               and 1_000 stay text, as written); an integer beyond int64 is a
               bad row; a str 'label' column becomes class indices. In a JSONL list,
               a column of lists of numbers becomes an ndarray field: shape [None]
               (flat lists) or [None, k] (lists of k-long lists, k the same in
               every row), int64 when every number is an integer, else float32;
               other lists and objects (ragged, deeper, text) become json.
               --field NAME=TYPE sets a column's type instead (int, float, str,
               json, or an ndarray dtype: bool, int8..int64, uint8..uint64,
               float16, float32, float64; CSV/TSV cells then hold JSON text); a
               row whose value does not fit is bad input (kind bad-row, naming
               the list and line)
  coco         SRC is the images folder, --annotations the COCO detection JSON;
               one record per entry of 'images', in its order: image, key
               (file_name), image_id, height, width (checked against the image),
               boxes (float32 [N,4], x0,y0,x1,y1 in pixels: COCO's x,y,w,h as
               x,y,x+w,y+h, clipped to the image: a box may reach 1 px past an
               edge and is stored cut there; the summary counts them), labels
               (int64 [N]: index of the category among the categories sorted by
               id; the manifest's classes are their names, its class_info the
               categories), iscrowd (uint8 [N]), area (float32 [N]; the stored
               box's when absent), segmentation (json: each box's polygons or
               RLE).
               Images without annotations are kept (0 boxes) unless --drop-empty.
               Bad annotations (a bbox that is not four numbers, a box with a
               side <= 0 or over 1 px outside the image, an undeclared category,
               an image id listed twice, an annotation of no image, a file_name
               leaving SRC, a size that is not the image's, an RLE mask whose
               counts do not cover height x width or whose compact string does
               not decode) stop the pack or are skipped with the image, named by
               annotation file, image id and annotation id.
               --max-side scales boxes, polygons, area, height and width with
               the image; it is refused when it would shrink an RLE mask.
  other names (tfrecord, webdataset, parquet, shards...) come from formats.codecs.registry

inputs:
  names starting with '.' are ignored and not counted. Every other listed file
  is an input: files are recognized by content, not name. A file that is not an
  image, is empty, corrupt, truncated, missing or unreadable stops the pack
  (--on-error fail) or is listed in DST/skipped.jsonl with its kind (skip);
  records in = written + skipped. Images are checked by signature, header and
  end marker, not decoded unless --verify-decode (see image field).

any files (--from files, --from filelist):
  a folder or list of images packs as above (image, key), also with stray other
  files (a README: not-an-image). When it holds files with other extensions and
  either no image or an image with a sidecar (a.jpg + a.txt), files are typed by
  extension and grouped WebDataset-style: a record is every file sharing a key
  (the path up to the first dot of the name: a.jpg + a.json + a.txt), one field
  per extension, named by it (jpg, json, txt), and key holds the stem, so
  key.field is the file name again. A file list's row is one record of one file
  (key: the path as listed), its columns as before.
    jpg, png, webp...  the image, checked as above (field typed jpeg/png/image)
    txt                str (UTF-8; else bad input, kind not-text)
    json               json (parsed; else bad-json; stored as canonical JSON)
    npy                ndarray: dtype and number of dimensions from the first
                       file, a dimension that differs between files is None;
                       read with the header parser, never unpickled (object
                       dtypes, another dtype or size: bad-array)
    wav, flac, mp3, ogg, opus, m4a
                       bytes, as they are (decode them in the Loader's workers)
    anything else      str when the first file of that extension is UTF-8 text,
                       else bytes
  An empty file of these kinds is an empty value ('' or b''; an empty .json or
  .npy is bad input); an empty image is bad input as above.
  Every record must have the same fields, the set most records have: a record
  with other files (a stray README.md) is bad input (other-fields), as is a file
  without an extension (no-extension). Folders on object storage are read as
  images only. Detection takes a folder with sub-folders and no image at its
  top as an image folder: name --from files for a tree of other files.

image field:
  images are recognized by content, never by name, and stored byte for byte
  unless --max-side shrinks them (a JPEG stays a JPEG, another format becomes a
  PNG) or --to-jpeg converts them. The field is typed by what it holds: 'jpeg' when every image
  is a JPEG, 'png' when every one is a PNG, else 'image' (readers sniff each
  record). This holds for every source: a TFRecord, WebDataset, Parquet or MDS
  source's image payloads are checked, re-encoded and skipped like files.
  Sizes are read from headers; no Pillow needed. With --to-jpeg: 16-bit samples
  are scaled (v/257), an alpha channel is dropped (as PIL's convert('RGB') does),
  grayscale stays gray, a GIF gives its first frame.
  What is checked: the signature, the header (size, sampling, bit depth) and the
  end marker; the pixels are decoded only to re-encode. An image damaged inside
  its compressed data but whole at both ends (zeroed bytes, a bad copy) packs;
  the Loader then fails on it naming its key, or skips it with on_error='skip'.
  --verify-decode decodes every image once, as the Loader does, and calls such
  an image corrupt: about 5x the time of a pack on one core (1.2 ms against 0.2
  ms per 95 kB JPEG), run in the workers.
  Kinds: corrupt (no signature for a .jpg name, a header that does not parse, or
  a decode that fails when re-encoding or verifying), truncated
  (no end marker, or shorter than its header says), unsupported (float samples,
  a GIF before OpenCV 4.11), too-large (a header declaring more than 268,435,456
  pixels, 2^28: --max-pixels raises it), unsupported-jpeg (a JPEG the Loader's
  decoder cannot read: 12- or 16-bit samples, 4:4:1 or another sampling it does
  not know, a hierarchical frame, a lossless one with a colour transform;
  --keep-unsupported keeps these byte for byte, and the Loader then refuses each
  with an error naming it, or skips it with on_error='skip').

--to imagefolder:
  a folder per class, empty ones too, named so that sorted order is the label
  order (000.. when unnamed; the names if valid, unique and sorted; else
  NNN-<name>); DST/classes.json lists the names. torchvision's ImageFolder reads
  the same labels (it needs allow_empty=True for empty classes, and skips .gif).

options for every source:
  --shuffle/--seed, --max-side, --to-jpeg, --on-error and --resume apply to
  container sources (tfrecord, webdataset, parquet, mds, shards) as to folders.
  --shuffle reads our shards in the shuffled order; other containers are first
  copied as they come into DST/.shardpack-shuffle (kept for a resume once
  complete; removed at the end).
  --on-error skip skips records whose image is bad; a damaged container file
  (a truncated tar, a bad TFRecord checksum) stops the pack, naming it.

output:
  bytes depend only on the input and the options, never on --workers; an
  interrupted pack (Ctrl-C, kill -9) leaves no manifest and resumes with --resume.

DST:
  a new or empty folder, or one holding an earlier pack's output. A folder holding
  files shardpack did not write is refused unless --overwrite, which packs beside
  them and never touches them: a pack deletes only what it can prove it wrote
  (listed in a manifest, a resume journal or an output ledger). One pack at a
  time per DST (a lock in DST/.shardpack.lock names the running pack's PID).
  --overwrite builds the new output in .<DST>.shardpack-new beside DST and swaps
  the two folders in one atomic step at the end: a kill leaves the old dataset
  or the new one, never neither; --resume finishes an interrupted replace. Until
  the swap, both datasets take disk space.
  A --resume refuses a source that is not the interrupted run's (other place,
  other files, sizes or times, other options).
engines (--engine):
  local  this machine (default)
  ray    Ray tasks (pip install 'shardpack[ray]'): the driver lists SRC once, each
         task packs --task-records consecutive records into its own part-* shards,
         the driver writes the manifest. Same records in the same order as local;
         shard boundaries differ. --workers caps the tasks at once. A local SRC
         (and a folder DST) must be at the same path on every node. Folder,
         file-list and coco sources only; --to shards only.

object storage:
  SRC and DST may be URIs: s3://bucket/prefix (settings from AWS_* variables or
  the query: ?endpoint_override=host:port&scheme=http), gs://, hdfs://, or any
  fsspec protocol when fsspec is installed. A remote image folder, folder of
  files or file list (paths relative to the list, beside it) is read in place,
  16 objects at a time; TFRecord, WebDataset, Parquet, MDS or shards are first
  fetched whole into $SHARDPACK_CACHE/sources. A remote DST is packed in a local
  staging folder under $SHARDPACK_CACHE (kept for --resume), then uploaded,
  manifest last.
exit status: 0 ok; 1 data or IO error, anything found by looking at SRC or DST (one
  line); 2 usage: flags and values that are wrong by themselves (after this usage
  block); 130 interrupted.
"""


#: How to pack past bad inputs, said once when one stops the pack.
_SKIP_HINT = "--on-error skip packs the rest and lists each bad input in DST/skipped.jsonl"

# The bar (tests replace it here to interrupt a pack at a chosen point).
_TqdmProgress = TqdmProgress


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return v


def _field_type(text: str) -> tuple[str, str]:
    name, sep, type_ = text.rpartition("=")
    if not sep or not name or not type_:
        raise argparse.ArgumentTypeError(f"expected NAME=TYPE (e.g. boxes=float32), not {text!r}")
    return name, type_


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pack-dataset",
        description="Pack a small-file dataset into sharded, indexed record files.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC",
                   help="image folder, folder of files, file list, or their URI (s3://...)")
    p.add_argument("dst", metavar="DST", help="output folder, or its URI (s3://bucket/ds)")
    p.add_argument("--from", dest="source", metavar="KIND",
                   help="imagefolder | files | filelist | coco | a formats.codecs.registry codec "
                        "(default: detect)")
    p.add_argument("--to", dest="sink", default="shards", metavar="KIND",
                   help="shards (default) | a formats.codecs.registry codec")
    p.add_argument("--shard-size", type=_size, default=None,
                   help="seal a shard at this data size, e.g. 64MB, 1GiB (default 256MB)")
    p.add_argument("--records-per-shard", type=_positive_int, default=None,
                   help="or at this many records")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes for decoding/re-encoding (default: all cores; 0: none)")
    p.add_argument("--max-side", type=_positive_int, default=None,
                   help="shrink images whose longer side exceeds N to exactly N (JPEGs "
                        "re-encoded; other formats stored as PNG unless --to-jpeg)")
    p.add_argument("--quality", type=_positive_int, default=None,
                   help="JPEG quality when re-encoding with --max-side or --to-jpeg "
                        "(default 90)")
    p.add_argument("--to-jpeg", action="store_true",
                   help="convert non-JPEG images (PNG, WebP, GIF, BMP, TIFF) to JPEG with "
                        "OpenCV: 16-bit scaled to 8, alpha dropped, gray kept")
    p.add_argument("--max-pixels", type=_positive_int, default=None, metavar="N",
                   help=f"the pixel budget: an image whose header declares more than N "
                        f"pixels is bad input, too-large (default {MAX_PIXELS:,}); read a "
                        "dataset packed with a larger N with reader.Loader(max_pixels=N)")
    p.add_argument("--keep-unsupported", action="store_true",
                   help="keep JPEGs the Loader cannot decode (unsupported-jpeg: 12-bit, "
                        "4:4:1...) byte for byte instead of as bad input; read them with "
                        "ds[i] and a decoder of your own")
    p.add_argument("--verify-decode", action="store_true",
                   help="decode every image once, as the Loader will: one damaged inside its "
                        "compressed data is bad input (corrupt) now, not a failed batch "
                        "later; about 5x the time of a pack on one core (1.2 ms against "
                        "0.2 ms per 95 kB JPEG), shared by the workers")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail",
                   help="fail: stop at the first bad input (default); skip: list it in skipped.jsonl")
    p.add_argument("--resume", action="store_true",
                   help="keep the shards an interrupted run of this pack finished")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the dataset (or output) already in DST, and pack into a DST "
                        "that holds other files; only files shardpack wrote are ever "
                        "deleted, the rest stay; the old dataset stays readable until the "
                        "new one is complete")
    p.add_argument("--shuffle", action="store_true", help="write records in a seeded random order")
    p.add_argument("--seed", type=int, default=None, help="--shuffle's seed (default 0)")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local: this machine (default); ray: tasks on a Ray cluster")
    p.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="the Ray cluster to join (default: start one here); --engine ray")
    p.add_argument("--task-records", type=_positive_int, default=None, metavar="N",
                   help=f"records per Ray task (default {DEFAULT_TASK_RECORDS:,}); --engine ray")
    p.add_argument("--image-root", metavar="DIR", default=None,
                   help="--from parquet: image columns holding file paths may lead into DIR "
                        "(default: only inside the Parquet file's own folder)")
    p.add_argument("--annotations", metavar="FILE", default=None,
                   help="--from coco: the COCO detection JSON (implies --from coco)")
    p.add_argument("--drop-empty", action="store_true",
                   help="--from coco: leave out images without annotations (counted and "
                        "listed in skipped.jsonl as no-annotations)")
    p.add_argument("--field", dest="field_types", metavar="NAME=TYPE", action="append",
                   type=_field_type, default=[],
                   help="--from filelist: store column NAME as TYPE instead of the inferred "
                        "type (int, float, str, json, or an ndarray dtype such as float32); "
                        "repeatable")
    p.add_argument("--no-tfrecord-index", dest="tfrecord_index", action="store_false",
                   help="--to tfrecord: no DALI .idx file beside each TFRecord file (they "
                        "are written by default; DALI's reader needs them)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary table")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    return p


def _resume_hint(argv: list[str]) -> str:
    args = [a for a in argv if a not in ("--resume", "--overwrite")]
    return shlex.join(["pack-dataset", *args, "--resume"])


def _refuse_idle_options(args) -> None:
    """An option given that would change nothing is a usage error, never ignored."""
    if args.quality is not None and args.max_side is None and not args.to_jpeg:
        raise UsageError("--quality sets the quality of re-encoded JPEGs: give --max-side "
                         "or --to-jpeg too")
    if args.seed is not None and not args.shuffle:
        raise UsageError("--seed is --shuffle's seed: give --shuffle too")
    if args.sink == "imagefolder" and (args.shard_size or args.records_per_shard):
        raise UsageError("--to imagefolder writes one file per record: --shard-size and "
                         "--records-per-shard do not apply")


def _os_error(exc: OSError, args, argv: list[str]) -> str:
    """An OS error with the file it concerns (DST when the system named none) and, where
    a rerun can finish the pack, how."""
    where = exc.filename or args.dst
    text = f"{where}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        if args.sink == "shards":
            return (f"{text}\nthe finished shards are kept: free some space, then finish "
                    f"with: {_resume_hint(argv)}")
        return f"{text}\nnothing was kept: free some space, then pack again"
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (also when called as a script)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _refuse_idle_options(args)
        shard_size = args.shard_size
        if shard_size is None and args.records_per_shard is None:
            shard_size = PackOptions.shard_size
        options = PackOptions(
            source=args.source, sink=args.sink, shard_size=shard_size,
            records_per_shard=args.records_per_shard, workers=args.workers,
            max_side=args.max_side, quality=90 if args.quality is None else args.quality,
            to_jpeg=args.to_jpeg,
            on_error=args.on_error, resume=args.resume, overwrite=args.overwrite,
            shuffle=args.shuffle, seed=args.seed or 0, engine=args.engine,
            ray_address=args.ray_address, task_records=args.task_records,
            tfrecord_index=args.tfrecord_index, image_root=args.image_root,
            annotations=args.annotations, drop_empty=args.drop_empty,
            field_types=tuple(args.field_types),
            max_pixels=MAX_PIXELS if args.max_pixels is None else args.max_pixels,
            keep_unsupported=args.keep_unsupported, verify_decode=args.verify_decode)
        summary = pack(args.src, args.dst, options, _TqdmProgress(args.quiet))
    # A URI that cannot be understood is usage too; what SRC or DST hold is not (below).
    except (UsageError, URIError) as exc:
        parser.print_usage(sys.stderr)
        print(f"pack-dataset: error: {exc}", file=sys.stderr)
        return 2
    except PackInterrupted as exc:
        print(f"\npack-dataset: {interrupted_text(exc.summary, _resume_hint(argv))}",
              file=sys.stderr)
        return 130
    except PackInputError as exc:
        # One bad input stopped the pack (--on-error fail): say, once, how to go past it.
        print(f"pack-dataset: error: {exc}; {_SKIP_HINT}", file=sys.stderr)
        return 1
    except ShardpackError as exc:
        print(f"pack-dataset: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pack-dataset: error: {_os_error(exc, args, argv)}", file=sys.stderr)
        return 1
    except ImportError as exc:  # an optional dependency, with its install hint
        print(f"pack-dataset: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    elif not args.quiet:
        print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
