"""Kernel struct offsets and raw tracepoint signatures from BTF, the only truth on our kernels.

The generic kernel headers bcc compiles against do not match the running kernel, so every field a
probe reads is looked up here (via ``bpftool -j btf dump``) and passed to the compiler with ``-D``.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_BTF_PATH = Path("/sys/kernel/btf/vmlinux")

# bpftool names unnamed types and members "(anon)"; raw BTF uses an empty name.
_ANON_NAMES = frozenset({"", "(anon)"})
# Qualifiers and tags that do not change a type's layout.
_TRANSPARENT_KINDS = frozenset({"TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"})
# Kinds needed for layout and for spelling argument types; FUNC, VAR, DATASEC and DECL_TAG are
# most of vmlinux BTF and are dropped to keep the cached object small.  Enum values are kept
# (~19k in 6.18's vmlinux): probes name kernel codes by them (skb_drop_reason).
_KEPT_KINDS = frozenset(
    {
        "INT",
        "FLOAT",
        "PTR",
        "ARRAY",
        "STRUCT",
        "UNION",
        "ENUM",
        "ENUM64",
        "FWD",
        "FUNC_PROTO",
        *_TRANSPARENT_KINDS,
    }
)
_POINTER_SIZE_BYTES = 8  # BTF does not record it; all our targets are 64-bit.


class BtfError(RuntimeError):
    """BTF could not be read, or a struct, member or tracepoint is not in it."""


@dataclass(frozen=True)
class FieldOffset:
    """Where a (possibly nested) member lives in a struct.

    ``bit_offset`` is from the start of ``struct``; ``bit_size`` is set only for bitfields, whose
    ``byte_offset`` is refused because reading whole bytes there would return neighbouring bits.
    """

    struct: str
    path: str
    bit_offset: int
    bit_size: int | None
    size_bytes: int

    @property
    def is_bitfield(self) -> bool:
        """True when the member is a bitfield (use ``bit_offset``/``bit_size``)."""
        return self.bit_size is not None

    @property
    def byte_offset(self) -> int:
        """Byte offset for a whole-byte read; raises `BtfError` for bitfields."""
        self.require_byte_aligned()
        return self.bit_offset // 8

    def require_byte_aligned(self) -> FieldOffset:
        """Return self, or raise `BtfError` if the member cannot be read as whole bytes."""
        if self.bit_size is not None or self.bit_offset % 8:
            raise BtfError(
                f"{self.struct}.{self.path} is a bitfield (bit offset {self.bit_offset}, "
                f"{self.bit_size} bits): it has no byte offset a probe could read"
            )
        return self


class _Member(NamedTuple):
    name: str
    type_id: int
    bits_offset: int
    bitfield_size: int | None


class _Type(NamedTuple):
    """The parts of one BTF type in use: bpftool's dicts take ~5x the memory, and this is cached."""

    kind: str
    name: str
    type_id: int = 0  # target of PTR, ARRAY, TYPEDEF and qualifiers
    size: int = 0
    nr_elems: int = 0  # ARRAY
    nr_bits: int = 0  # INT
    int_bits_offset: int = 0  # INT (old-style bitfields)
    fwd_kind: str = ""  # FWD: "struct" or "union"
    members: tuple[_Member, ...] = ()
    params: tuple[int, ...] = ()  # FUNC_PROTO parameter type ids
    enumerators: tuple[tuple[str, int], ...] = ()  # ENUM, ENUM64: (name, value)


def _compact(entry: Mapping[str, Any]) -> _Type:
    kind = str(entry["kind"])
    name = sys.intern(str(entry.get("name", "")))
    members = tuple(
        _Member(
            sys.intern(str(m["name"])),
            int(m["type_id"]),
            int(m["bits_offset"]),
            int(m["bitfield_size"]) if m.get("bitfield_size") else None,
        )
        for m in entry.get("members", ())
    )
    return _Type(
        kind=kind,
        name=name,
        type_id=int(entry.get("type_id", 0)),
        size=int(entry.get("size", 0)),
        nr_elems=int(entry.get("nr_elems", 0)),
        nr_bits=int(entry.get("nr_bits", 0)),
        int_bits_offset=int(entry.get("bits_offset", 0)) if kind == "INT" else 0,
        fwd_kind=str(entry.get("fwd_kind", "")),
        members=members,
        params=tuple(int(p["type_id"]) for p in entry.get("params", ())),
        enumerators=tuple(
            (sys.intern(str(v["name"])), int(v["val"])) for v in entry.get("values", ())
        ),
    )


class Btf:
    """Types from one BTF blob, indexed for member and tracepoint lookups."""

    def __init__(self, types: Iterable[Mapping[str, Any]]) -> None:
        self._types: dict[int, _Type] = {}
        self._by_name: dict[str, list[int]] = {}
        for entry in types:
            if entry["kind"] not in _KEPT_KINDS:
                continue
            compact = _compact(entry)
            type_id = int(entry["id"])
            self._types[type_id] = compact
            if compact.name not in _ANON_NAMES:
                self._by_name.setdefault(compact.name, []).append(type_id)

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Btf:
        """Build from bpftool's JSON document (``{"types": [...]}``)."""
        try:
            return cls(document["types"])
        except (KeyError, TypeError, ValueError) as error:
            raise BtfError(f"not a bpftool BTF JSON document: {error!r}") from error

    @classmethod
    def load(cls, path: Path | str = DEFAULT_BTF_PATH, *, bpftool: str = "bpftool") -> Btf:
        """Dump ``path`` with bpftool and parse it; cached per process and path."""
        return _load_cached(str(path), bpftool)

    # -- members ------------------------------------------------------------------------------

    def member(self, struct: str, path: str) -> FieldOffset:
        """Offset of ``path`` (dotted, through anonymous structs/unions) inside ``struct``."""
        struct_name = struct.removeprefix("struct ").removeprefix("union ").strip()
        candidates = [
            tid
            for tid in self._by_name.get(struct_name, [])
            if self._types[tid].kind in ("STRUCT", "UNION")
        ]
        if not candidates:
            raise BtfError(f"struct {struct_name} is not in BTF")
        found: dict[tuple[int, int | None, int], None] = {}
        errors: list[str] = []
        for tid in candidates:
            try:
                found[self._walk(tid, struct_name, path)] = None
            except BtfError as error:
                errors.append(str(error))
        if not found:
            raise BtfError(errors[0])
        if len(found) > 1:
            # Static structs in different compilation units can share a name.
            raise BtfError(
                f"struct {struct_name} is defined {len(candidates)} times in BTF with different "
                f"layouts for {path}"
            )
        bit_offset, bit_size, size_bytes = next(iter(found))
        return FieldOffset(struct_name, path, bit_offset, bit_size, size_bytes)

    def _walk(self, struct_id: int, struct_name: str, path: str) -> tuple[int, int | None, int]:
        parts = path.split(".")
        if not all(parts):
            raise BtfError(f"bad member path {path!r} for struct {struct_name}")
        type_id = struct_id
        bit_offset = 0
        bit_size: int | None = None
        for depth, part in enumerate(parts):
            container = self._types.get(self._strip(type_id))
            if container is None or container.kind not in ("STRUCT", "UNION"):
                where = ".".join(parts[:depth])
                raise BtfError(
                    f"{struct_name}.{where} is a {self.type_name(type_id)}, not a struct: "
                    f"cannot look up {part} in it (offsets do not follow pointers)"
                )
            hit = self._find_member(container, part)
            if hit is None:
                where = ".".join([struct_name, *parts[:depth]])
                raise BtfError(f"{where} has no member {part}")
            member_offset, bit_size, type_id = hit
            bit_offset += member_offset
        # Old-style BTF encodes bitfields in the INT type rather than in the member.
        target = self._types.get(self._strip(type_id))
        if (
            bit_size is None
            and target is not None
            and target.kind == "INT"
            and (target.nr_bits != 8 * target.size or target.int_bits_offset)
        ):
            bit_offset += target.int_bits_offset
            bit_size = target.nr_bits
        return bit_offset, bit_size, self.size_of(type_id)

    def _find_member(self, container: _Type, name: str) -> tuple[int, int | None, int] | None:
        """(bit offset, bitfield bits or None, type id), searching anonymous members recursively."""
        for member in container.members:
            if member.name == name:
                return member.bits_offset, member.bitfield_size, member.type_id
            if member.name in _ANON_NAMES:
                inner = self._types.get(self._strip(member.type_id))
                if inner is not None and inner.kind in ("STRUCT", "UNION"):
                    hit = self._find_member(inner, name)
                    if hit is not None:
                        return member.bits_offset + hit[0], hit[1], hit[2]
        return None

    def _strip(self, type_id: int) -> int:
        """Follow typedefs and qualifiers to the underlying type."""
        for _ in range(64):
            entry = self._types.get(type_id)
            if entry is None or entry.kind not in _TRANSPARENT_KINDS:
                return type_id
            type_id = entry.type_id
        raise BtfError(f"typedef loop at BTF type {type_id}")

    def size_of(self, type_id: int) -> int:
        """Size in bytes of a BTF type (0 for void and function prototypes)."""
        entry = self._types.get(self._strip(type_id))
        if entry is None:
            return 0
        if entry.kind == "PTR":
            return _POINTER_SIZE_BYTES
        if entry.kind == "ARRAY":
            return entry.nr_elems * self.size_of(entry.type_id)
        return entry.size

    # -- enums --------------------------------------------------------------------------------

    def enum_values(self, name: str) -> dict[str, int]:
        """Enumerator name -> value of ``enum <name>`` (e.g. ``skb_drop_reason``)."""
        enum_name = name.removeprefix("enum ").strip()
        for type_id in self._by_name.get(enum_name, []):
            entry = self._types[type_id]
            if entry.kind in ("ENUM", "ENUM64"):
                return dict(entry.enumerators)
        raise BtfError(f"enum {enum_name} is not in BTF")

    def enum_with(self, enumerator: str) -> dict[str, int]:
        """Enumerator name -> value of the enum, named or anonymous, that has ``enumerator``
        (the kernel's softirq numbers are an anonymous enum)."""
        for entry in self._types.values():
            if entry.kind in ("ENUM", "ENUM64") and any(
                name == enumerator for name, _ in entry.enumerators
            ):
                return dict(entry.enumerators)
        raise BtfError(f"no enum with {enumerator} in BTF")

    # -- tracepoints --------------------------------------------------------------------------

    def tracepoint_args(self, name: str) -> list[str]:
        """C types of raw tracepoint ``name``'s arguments (the ``void *`` context skipped)."""
        typedef_name = f"btf_trace_{name}"
        typedefs = [t for t in self._by_name.get(typedef_name, []) if self._kind(t) == "TYPEDEF"]
        if not typedefs:
            raise BtfError(f"raw tracepoint {name} is not in BTF (no typedef {typedef_name})")
        proto_id = self._strip(typedefs[0])
        if self._kind(proto_id) == "PTR":
            proto_id = self._strip(self._types[proto_id].type_id)
        if self._kind(proto_id) != "FUNC_PROTO":
            raise BtfError(f"{typedef_name} is not a function pointer typedef")
        return [self.type_name(param) for param in self._types[proto_id].params[1:]]

    def tracepoint_btf_id(self, name: str) -> int:
        """BTF type id of the ``btf_trace_<name>`` typedef: a tp_btf program's attach target."""
        typedefs = [
            t for t in self._by_name.get(f"btf_trace_{name}", []) if self._kind(t) == "TYPEDEF"
        ]
        if not typedefs:
            raise BtfError(f"raw tracepoint {name} is not in BTF (no typedef btf_trace_{name})")
        return typedefs[0]

    def _kind(self, type_id: int) -> str:
        entry = self._types.get(type_id)
        return "VOID" if entry is None else entry.kind

    def type_name(self, type_id: int) -> str:
        """C spelling of a type, e.g. ``struct task_struct *`` or ``const char *``."""
        entry = self._types.get(type_id)
        if entry is None:
            return "void" if type_id == 0 else f"<BTF type {type_id}>"
        kind, name = entry.kind, entry.name
        if kind in ("INT", "FLOAT", "TYPEDEF"):
            return name
        if kind in ("STRUCT", "UNION", "ENUM", "ENUM64", "FWD"):
            tag = {"STRUCT": "struct", "UNION": "union", "FWD": entry.fwd_kind or "struct"}
            label = "(anon)" if name in _ANON_NAMES else name
            return f"{tag.get(kind, 'enum')} {label}"
        if kind == "PTR":
            inner = self.type_name(entry.type_id)
            return f"{inner}*" if inner.endswith("*") else f"{inner} *"
        if kind in ("CONST", "VOLATILE"):
            return f"{kind.lower()} {self.type_name(entry.type_id)}"
        if kind == "ARRAY":
            return f"{self.type_name(entry.type_id)}[{entry.nr_elems}]"
        if kind == "FUNC_PROTO":
            return "function"
        return self.type_name(entry.type_id)  # RESTRICT, TYPE_TAG


@functools.cache
def _load_cached(path: str, bpftool: str) -> Btf:
    executable = shutil.which(bpftool)
    if executable is None:
        raise BtfError(f"{bpftool} not found: install it (apt-get install bpftool) to read BTF")
    if not Path(path).is_file():
        raise BtfError(f"no BTF at {path}: the kernel needs CONFIG_DEBUG_INFO_BTF=y")
    result = subprocess.run(
        [executable, "-j", "btf", "dump", "file", path], capture_output=True, check=False
    )
    if result.returncode != 0:
        output = result.stderr or result.stdout[:200]
        message = output.decode(errors="replace").strip()
        raise BtfError(f"bpftool could not dump BTF from {path}: {message}")
    try:
        document = json.loads(result.stdout)
    except json.JSONDecodeError as error:
        raise BtfError(f"bpftool printed invalid JSON for {path}: {error}") from error
    return Btf.from_json(document)
