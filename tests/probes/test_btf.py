"""BTF lookups: a hand-written BTF document with known layout, and the running kernel's BTF
cross-checked against a naive flattening of bpftool's JSON written independently here."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tailsight.probes.btf import DEFAULT_BTF_PATH, Btf, BtfError

# -- hand-written fixture: tests/fixtures/btf/small.json ------------------------------------
# struct outer {                         // 24 bytes
#     int head;                          // byte 0
#     union {                            // byte 8
#         struct { u32 x; u32 y; };      // x at 8, y at 12
#         u64 raw;                       // 8
#     };
#     unsigned int flags : 3;            // bit 128
#     unsigned int mode : 5;             // bit 131
#     char name[4];                      // byte 20
# };
# typedef const struct outer outer_t;    (via typedef -> const -> struct)
# struct container { long pad; outer_t embedded; struct outer *ptr; };  // embedded at 8, ptr at 32
# typedef void (*btf_trace_fake)(void *, bool, const struct outer *, unsigned int);
# struct dup appears twice with the same layout for `a`, differently for `b`.
FIXTURE_PATH = Path(__file__).parents[1] / "fixtures" / "btf" / "small.json"


def load_fixture_btf() -> Btf:
    """The hand-written BTF above (also used by test_offsets.py)."""
    return Btf.from_json(json.loads(FIXTURE_PATH.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def fixture_btf() -> Btf:
    return load_fixture_btf()


def test_plain_member(fixture_btf: Btf) -> None:
    head = fixture_btf.member("outer", "head")
    assert (head.byte_offset, head.size_bytes, head.bit_size) == (0, 4, None)


@pytest.mark.parametrize(
    ("path", "byte_offset", "size_bytes"),
    [("x", 8, 4), ("y", 12, 4), ("raw", 8, 8), ("name", 20, 4)],
)
def test_member_inside_anonymous_struct_in_anonymous_union(
    fixture_btf: Btf, path: str, byte_offset: int, size_bytes: int
) -> None:
    field = fixture_btf.member("struct outer", path)
    assert (field.byte_offset, field.size_bytes) == (byte_offset, size_bytes)


def test_dotted_path_through_typedef_const_chain(fixture_btf: Btf) -> None:
    embedded = fixture_btf.member("container", "embedded")
    assert (embedded.byte_offset, embedded.size_bytes) == (8, 24)
    assert fixture_btf.member("container", "embedded.y").byte_offset == 8 + 12
    assert fixture_btf.member("container", "embedded.mode").bit_offset == 64 + 131


def test_bitfield_refuses_byte_offset(fixture_btf: Btf) -> None:
    mode = fixture_btf.member("outer", "mode")
    assert (mode.bit_offset, mode.bit_size, mode.is_bitfield) == (131, 5, True)
    with pytest.raises(BtfError, match=r"outer\.mode is a bitfield"):
        _ = mode.byte_offset
    with pytest.raises(BtfError, match="bitfield"):
        mode.require_byte_aligned()
    assert fixture_btf.member("outer", "head").require_byte_aligned().byte_offset == 0


@pytest.mark.parametrize(
    ("struct", "path", "message"),
    [
        ("outer", "missing", r"outer has no member missing"),
        ("container", "embedded.nothing", r"container\.embedded has no member nothing"),
        ("container", "ptr.x", r"container\.ptr is a struct outer \*.*do not follow pointers"),
        ("no_such_struct", "x", r"struct no_such_struct is not in BTF"),
        ("outer", "head..x", r"bad member path"),
    ],
)
def test_lookup_errors_name_what_is_missing(
    fixture_btf: Btf, struct: str, path: str, message: str
) -> None:
    with pytest.raises(BtfError, match=message):
        fixture_btf.member(struct, path)


def test_duplicate_struct_names(fixture_btf: Btf) -> None:
    # `a` agrees in every definition that has it; `b` does not.
    assert fixture_btf.member("dup", "a").byte_offset == 0
    with pytest.raises(BtfError, match="different layouts"):
        fixture_btf.member("dup", "b")


def test_tracepoint_args_skip_context(fixture_btf: Btf) -> None:
    assert fixture_btf.tracepoint_args("fake") == ["bool", "const struct outer *", "unsigned int"]
    with pytest.raises(BtfError, match="raw tracepoint nope is not in BTF"):
        fixture_btf.tracepoint_args("nope")


def test_not_a_bpftool_document() -> None:
    with pytest.raises(BtfError, match="not a bpftool BTF JSON"):
        Btf.from_json({"kinds": []})


def test_load_without_bpftool_is_a_clear_error() -> None:
    with pytest.raises(BtfError, match=r"no-such-bpftool not found.*apt-get install bpftool"):
        Btf.load(DEFAULT_BTF_PATH, bpftool="no-such-bpftool")


def test_load_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool not installed")
    with pytest.raises(BtfError, match="no BTF at"):
        Btf.load(tmp_path / "vmlinux")


# -- the running kernel's BTF ---------------------------------------------------------------------


@dataclass(frozen=True)
class RawBtf:
    """bpftool's JSON as loaded here, independently of btf.py: types by id, struct ids by name."""

    types: dict[int, dict[str, Any]]
    struct_ids: dict[str, list[int]]

    def unique_struct(self, name: str) -> int | None:
        ids = self.struct_ids.get(name, [])
        return ids[0] if len(ids) == 1 else None

    def skip_qualifiers(self, type_id: int) -> int:
        while type_id and self.types[type_id]["kind"] in {"TYPEDEF", "CONST", "VOLATILE"}:
            type_id = self.types[type_id]["type_id"]
        return type_id

    def naive_flatten(self, struct_id: int) -> dict[str, tuple[int, int | None]]:
        """name -> (absolute bit offset, bitfield size) of every member visible by name,
        expanding anonymous structs/unions breadth-first with a work list."""
        flat: dict[str, tuple[int, int | None]] = {}
        work = [(struct_id, 0)]
        while work:
            type_id, base_bits = work.pop(0)
            for member in self.types[type_id]["members"]:
                bits = base_bits + member["bits_offset"]
                if member["name"] == "(anon)":
                    inner = self.skip_qualifiers(member["type_id"])
                    if self.types[inner]["kind"] in {"STRUCT", "UNION"}:
                        work.append((inner, bits))
                    continue
                flat.setdefault(member["name"], (bits, member.get("bitfield_size") or None))
        return flat


@pytest.fixture(scope="module")
def raw() -> RawBtf:
    if shutil.which("bpftool") is None:
        pytest.skip("kernel: bpftool not installed")
    if not DEFAULT_BTF_PATH.exists():
        pytest.skip(f"kernel: no BTF at {DEFAULT_BTF_PATH}")
    dump = subprocess.run(
        ["bpftool", "-j", "btf", "dump", "file", str(DEFAULT_BTF_PATH)],
        capture_output=True,
        check=True,
    ).stdout
    types = {entry["id"]: entry for entry in json.loads(dump)["types"]}
    struct_ids: dict[str, list[int]] = {}
    for type_id, entry in types.items():
        if entry["kind"] == "STRUCT" and entry["name"] != "(anon)":
            struct_ids.setdefault(entry["name"], []).append(type_id)
    return RawBtf(types, struct_ids)


@pytest.fixture(scope="module")
def kernel_btf(raw: RawBtf) -> Btf:
    return Btf.load()


@pytest.mark.kernel
def test_task_struct_fields_have_kernel_sizes(kernel_btf: Btf) -> None:
    for path, size_bytes in [("pid", 4), ("tgid", 4), ("comm", 16), ("cgroups", 8)]:
        field = kernel_btf.member("task_struct", path)
        assert field.size_bytes == size_bytes
        assert field.bit_size is None


@pytest.mark.kernel
def test_task_struct_offsets_inside_struct_and_match_naive_flattening(
    kernel_btf: Btf, raw: RawBtf
) -> None:
    task_id = raw.unique_struct("task_struct")
    assert task_id is not None
    task_size_bytes = raw.types[task_id]["size"]
    flat = raw.naive_flatten(task_id)
    for name in ["pid", "tgid", "comm", "cgroups", "__state", "se", "on_cpu"]:
        field = kernel_btf.member("task_struct", name)
        assert field.byte_offset >= 0
        assert field.byte_offset + field.size_bytes <= task_size_bytes
        assert (field.bit_offset, field.bit_size) == flat[name]
    # pid and tgid are adjacent pid_t's in every kernel since 2.6.
    pid = kernel_btf.member("task_struct", "pid").byte_offset
    assert kernel_btf.member("task_struct", "tgid").byte_offset == pid + 4


def _first_struct_with(raw: RawBtf, wanted: str) -> tuple[str, str, int] | None:
    """(struct name, member name, struct id) of the first named struct showing ``wanted``."""
    for name in sorted(raw.struct_ids):
        struct_id = raw.unique_struct(name)
        if struct_id is None:
            continue
        for member in raw.types[struct_id]["members"]:
            inner_id = raw.skip_qualifiers(member["type_id"])
            if wanted == "bitfield" and member.get("bitfield_size"):
                return name, member["name"], struct_id
            if (
                wanted == "anon-union"
                and member["name"] == "(anon)"
                and raw.types[inner_id]["kind"] == "UNION"
                and member["bits_offset"] > 0
            ):
                named = [m for m in raw.types[inner_id]["members"] if m["name"] != "(anon)"]
                if named:
                    return name, named[0]["name"], struct_id
    return None


@pytest.mark.kernel
@pytest.mark.parametrize("wanted", ["anon-union", "bitfield"])
def test_real_anon_union_and_bitfield_members(kernel_btf: Btf, raw: RawBtf, wanted: str) -> None:
    found = _first_struct_with(raw, wanted)
    assert found is not None, f"no struct with a {wanted} member in kernel BTF"
    struct, member, struct_id = found
    field = kernel_btf.member(struct, member)
    assert (field.bit_offset, field.bit_size) == raw.naive_flatten(struct_id)[member]
    if wanted == "bitfield":
        with pytest.raises(BtfError, match="bitfield"):
            field.require_byte_aligned()
    else:
        assert field.byte_offset > 0  # inside a union that is not at the start of the struct


@pytest.mark.kernel
def test_many_kernel_structs_match_naive_flattening(kernel_btf: Btf, raw: RawBtf) -> None:
    unique = sorted(name for name, ids in raw.struct_ids.items() if len(ids) == 1)
    checked = 0
    for name in random.Random(5).sample(unique, 300):
        struct_id = raw.struct_ids[name][0]
        for member, (bits, bitfield_size) in raw.naive_flatten(struct_id).items():
            field = kernel_btf.member(name, member)
            assert (field.bit_offset, field.bit_size) == (bits, bitfield_size), (name, member)
            checked += 1
    assert checked > 1000


@pytest.mark.kernel
def test_nested_path_adds_offsets(kernel_btf: Btf) -> None:
    se = kernel_btf.member("task_struct", "se").byte_offset
    inner = kernel_btf.member("sched_entity", "sum_exec_runtime").byte_offset
    nested = kernel_btf.member("task_struct", "se.sum_exec_runtime")
    assert (nested.byte_offset, nested.size_bytes) == (se + inner, 8)


@pytest.mark.kernel
def test_tracepoint_args_match_kernel_tp_proto(kernel_btf: Btf) -> None:
    # TP_PROTO in include/trace/events/sched.h and the raw syscall tracepoints.
    assert kernel_btf.tracepoint_args("sched_switch") == [
        "bool",
        "struct task_struct *",
        "struct task_struct *",
        "unsigned int",
    ]
    assert kernel_btf.tracepoint_args("sched_wakeup") == ["struct task_struct *"]
    assert kernel_btf.tracepoint_args("sys_enter") == ["struct pt_regs *", "long int"]
