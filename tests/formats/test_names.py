"""The one rule for names that become paths (formats.names): what it refuses, what it
maps, and that a mapped name never leaves its folder nor meets another (issue 35)."""

from __future__ import annotations

import os
import posixpath
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formats.errors import UnsafePathError
from formats.files import check_plain_name
from formats.names import (
    MAX_PART_BYTES,
    NameClaims,
    check_name,
    safe_name,
    safe_path,
    unsafe_reason,
)
from formats.storage.location import _check_name

# Names that must never become a path as they are, each with why.
HOSTILE = {
    "../up": "'..' part",
    "../../../etc/passwd": "'..' part",
    "/etc/passwd": "absolute",
    "\\evil": "absolute",
    "C:evil": "absolute",
    "a\\..\\b": "backslash",
    "nul\x00byte": "NUL",
    "bell\x07": "control",
    "del\x7f": "control",
    "c1\x85": "control",
    "a/../..": "'..' part",
    "./..": "'..' part",
    "a//b": "empty",
    "": "empty",
    ".": "'.'",
    "..": "'..'",
    "x" * (MAX_PART_BYTES + 1): "longer than 255",
    "é" * 128: "longer than 255",  # 256 bytes in 128 characters
    "\uff0e\uff0e": "normalises",  # fullwidth "．．": NFKC gives ".."
    "\uff0e\uff0e\uff0fx": "normalises",  # "．．／x": NFKC gives "../x"
    "a\u2025": "normalises",  # "‥" (two dot leader)
    "\ufe52\ufe52": "normalises",  # small full stops
    "lone\udc80": "lone surrogate",
}


@pytest.mark.parametrize("name", list(HOSTILE), ids=ascii)
def test_each_hostile_name_is_unsafe_with_its_reason(name):
    reason = unsafe_reason(name, parts=True)
    assert reason is not None
    assert any(w in reason for w in HOSTILE[name].split("/")) or HOSTILE[name] in reason, reason


@pytest.mark.parametrize("name", ["shard-00001.rec", "cat/001.jpg", "日本語.jpg", "é", "ﬁsh",
                                  "a.b.c", "x" * MAX_PART_BYTES, "...a"])
def test_ordinary_names_are_safe(name):
    assert unsafe_reason(name, parts=True) is None


def test_a_slash_is_a_part_separator_only_where_parts_are_allowed():
    assert unsafe_reason("cat/001.jpg", parts=True) is None
    assert "'/'" in unsafe_reason("cat/001.jpg")
    assert unsafe_reason(3) == "not text (int)"


def test_refusal_names_where_the_record_and_the_name():
    with pytest.raises(UnsafePathError, match=r"ds/shards.arrow record 7: unsafe key: "
                       r"must be a plain name .*a '/' in a single name.*found '\.\./x'") as info:
        check_name("../x", where="ds/shards.arrow", what="key", record=7)
    assert info.value.record == 7 and info.value.found == "../x"
    assert check_name("a/b", where="d", parts=True) == "a/b"


@pytest.mark.parametrize("name", list(HOSTILE), ids=ascii)
def test_manifest_names_and_object_names_refuse_by_the_same_rule(name):
    with pytest.raises(UnsafePathError):
        check_plain_name("/ds", name, what="shard name")
    with pytest.raises(UnsafePathError, match="unsafe object name"):
        _check_name("s3://b/ds", name)


@pytest.mark.parametrize("name", list(HOSTILE), ids=ascii)
def test_a_mapped_name_is_one_safe_part(name):
    mapped = safe_name(name, "fallback")
    assert unsafe_reason(mapped) is None, ascii(mapped)
    assert not mapped.startswith(".")
    assert len(mapped.encode("utf-8")) <= 200


@pytest.mark.parametrize("name", list(HOSTILE), ids=ascii)
def test_a_mapped_path_stays_inside_its_folder(name):
    mapped = safe_path(name, "fallback")
    assert unsafe_reason(mapped, parts=True) is None, ascii(mapped)
    assert not posixpath.normpath(posixpath.join("/root", mapped)).startswith("/root/..")


def test_mapping_keeps_what_is_harmless():
    assert safe_name("cat", "f") == "cat"
    assert safe_name("日本語.jpg", "f") == "日本語.jpg"
    assert safe_name("a:b*c", "f") == "a_b_c"  # what Windows refuses in a name
    assert safe_name("  .hidden. ", "f") == "hidden"
    assert safe_name("..", "f") == safe_name("", "f") == safe_name(" . ", "f") == "f"
    assert safe_path("a/../b", "f") == "a/b"  # never followed: dropped
    assert safe_path("../../x.jpg", "f") == "x.jpg"
    assert safe_path("a\\b", "f") == "a/b"
    assert safe_name("x" * 300, "f", limit=250) == "x" * 250


@given(st.text(max_size=400))
def test_any_text_maps_to_a_safe_name_and_a_safe_path(text):
    name = safe_name(text, "f")
    assert unsafe_reason(name) is None
    path = safe_path(text, "f")
    assert unsafe_reason(path, parts=True) is None
    assert not os.path.isabs(path) and ".." not in path.split("/")


def test_claims_tell_apart_names_a_file_system_would_merge():
    claims = NameClaims()
    assert claims.claim("Cat.jpg")
    assert not claims.claim("cat.JPG")  # case-insensitive file systems
    nfd = unicodedata.normalize("NFD", "é.jpg")
    assert claims.claim("é.jpg") and not claims.claim(nfd)  # macOS normalises
    assert claims.unique("cat", ".jpg", 7) == "cat_00000007.jpg"
    assert claims.unique("cat", ".jpg", 7) == "cat_00000007_2.jpg"
    assert claims.unique("dog", ".jpg", 8, taken=lambda n: n == "dog.jpg") == "dog_00000008.jpg"
