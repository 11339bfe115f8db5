#!/usr/bin/env python3
"""Check equarx's protobuf schema (core/proto/xla/*.proto) against XLA's own descriptors.

prost drops fields it does not know, so our schema must declare every field
number that XLA writes, with a wire-compatible type. This script walks every
message reachable from xla.HloProto, xla.HloModuleProto and
xla.HloModuleProtoWithConfig in XLA's descriptors ("reference") and checks
the same path in ours:

  * every reference field number exists in ours           (error if missing)
  * same wire type and the same decoding                  (error if not)
    - a reference message may be `bytes` in ours (same wire form; the
      content is carried opaquely and not checked further)
    - reference `string` may be `bytes` in ours; int32 <-> enum is fine
  * same cardinality (repeated vs singular)                (error if not)
  * a scalar with explicit presence in XLA (proto3 `optional` / oneof) has
    presence in ours                                        (error if not)
  * every enum value number of XLA exists in ours          (error if missing)
  * field names equal (JSON uses them)                      (warning if not)

Reference descriptors come from:
  * WHEEL_DIR: an unpacked tensorflow(-cpu) wheel; the serialized descriptors
    are read out of tensorflow/compiler/xla/{xla_data,xla}_pb2.py and
    .../service/hlo_pb2.py WITHOUT importing them (so neither TensorFlow nor a
    matching protobuf runtime version is needed). TF 2.21 ships no xla_pb2.py,
    so HloModuleProtoWithConfig is checked only with --ref-binary/--ref-fds.
  * --ref-binary FILE (repeatable): a shared library with XLA compiled in (e.g.
    jaxlib's libjax_common.so or xla_extension.so). C++ protobuf code embeds
    each .proto's serialized FileDescriptorProto; they are located by file name.
  * --ref-fds FILE (repeatable): a binary FileDescriptorSet.

OUR_FDS is our schema compiled to a binary FileDescriptorSet, e.g. with the
protox CLI (`cargo install protox --features bin`):

  protox --include_imports -I core/proto -o /tmp/equarx_xla.fds \
      core/proto/xla/hlo.proto core/proto/xla/xla.proto
  python3 scripts/check_proto_schema.py /tmp/tfwheel_unpacked /tmp/equarx_xla.fds \
      [--ref-binary .../jaxlib/libjax_common.so]

Needs only the standard library and the `protobuf` package.
Exit status: 0 = compatible, 1 = incompatibility found, 2 = usage/input error.
"""

import argparse
import ast
import os
import re
import sys

try:
    from google.protobuf import descriptor_pb2
except ImportError:  # pragma: no cover
    sys.exit("check_proto_schema.py needs the `protobuf` package (pip install protobuf)")

F = descriptor_pb2.FieldDescriptorProto

ROOTS = ("xla.HloProto", "xla.HloModuleProto", "xla.HloModuleProtoWithConfig")

# .proto files looked for in a binary (old and new locations).
XLA_PROTO_FILES = (
    "xla/xla_data.proto",
    "xla/service/hlo.proto",
    "xla/xla.proto",
    "tensorflow/compiler/xla/xla_data.proto",
    "tensorflow/compiler/xla/service/hlo.proto",
    "tensorflow/compiler/xla/xla.proto",
)

# Divergences we know about and accept; they are reported as warnings.
# (message full name, field number) -> reason
KNOWN_DIVERGENCES = {
    (".xla.OriginalArrayProto", 1): "pre-mid-2025 OriginalArrayProto layout is wire-incompatible with the newer one; the newer is declared",
    (".xla.OriginalArrayProto", 2): "pre-mid-2025 OriginalArrayProto layout is wire-incompatible with the newer one; the newer is declared",
    (".xla.OriginalArrayProto", 3): "pre-mid-2025 OriginalArrayProto layout is wire-incompatible with the newer one; the newer is declared",
    (".xla.OriginalValueProto", 1): "pre-mid-2025 OriginalValueProto layout (leaves) is wire-incompatible with the newer one (elements); the newer is declared",
}

VARINT = {F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_BOOL, F.TYPE_ENUM}
ZIGZAG = {F.TYPE_SINT32, F.TYPE_SINT64}
FIXED32 = {F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_FLOAT}
FIXED64 = {F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE}
LENGTH = {F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE}
TYPE_NAME = {v: k[5:].lower() for k, v in F.Type.items()}
VARINT_BITS = {F.TYPE_BOOL: 1, F.TYPE_INT32: 32, F.TYPE_UINT32: 32, F.TYPE_ENUM: 32,
               F.TYPE_INT64: 64, F.TYPE_UINT64: 64}


# ---------------------------------------------------------------------------
# Loading descriptors
# ---------------------------------------------------------------------------

def _fdp_from_bytes(blob):
    fd = descriptor_pb2.FileDescriptorProto()
    try:
        fd.ParseFromString(blob)
    except Exception:  # noqa: BLE001 - any parse failure means "not a descriptor"
        return None
    if not fd.name.endswith(".proto"):
        return None
    return fd


def load_pb2_py(path):
    """Serialized FileDescriptorProtos found as bytes literals in a *_pb2.py."""
    with open(path, "rb") as fh:
        tree = ast.parse(fh.read(), filename=path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            fd = _fdp_from_bytes(node.value)
            if fd is not None and (fd.message_type or fd.enum_type):
                out.append(fd)
    return out


def load_wheel(wheel_dir):
    base = os.path.join(wheel_dir, "tensorflow", "compiler", "xla")
    files, notes = [], []
    for rel in ("xla_data_pb2.py", os.path.join("service", "hlo_pb2.py"), "xla_pb2.py"):
        p = os.path.join(base, rel)
        if os.path.exists(p):
            got = load_pb2_py(p)
            if not got:
                notes.append(f"no descriptor found in {p}")
            files.extend(got)
        else:
            notes.append(f"{p} not in the wheel")
    return files, notes


def _varint(b, i):
    r, s = 0, 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return r, i


# FileDescriptorProto fields (number, wire type) that may appear at top level.
_FDP_FIELDS = {(1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 2), (7, 2), (8, 2), (9, 2),
               (10, 0), (10, 2), (11, 0), (11, 2), (12, 2), (13, 2), (14, 0)}


def load_binary(path, names=XLA_PROTO_FILES):
    """Embedded serialized FileDescriptorProtos of the given .proto files."""
    with open(path, "rb") as fh:
        data = fh.read()
    found = {}
    for name in names:
        nb = name.encode()
        pat = bytes([0x0A, len(nb)]) + nb
        for m in re.finditer(re.escape(pat), data):
            start = i = m.start()
            try:
                while i < len(data):
                    tag, j = _varint(data, i)
                    if (tag >> 3, tag & 7) not in _FDP_FIELDS:
                        break
                    if tag & 7 == 0:
                        _, j = _varint(data, j)
                    else:
                        ln, j = _varint(data, j)
                        j += ln
                    if j > len(data):
                        break
                    i = j
            except IndexError:
                pass
            fd = _fdp_from_bytes(data[start:i])
            if fd is not None and fd.name == name and (fd.message_type or fd.enum_type):
                found[name] = fd
                break
    return list(found.values())


def load_fds(path):
    fds = descriptor_pb2.FileDescriptorSet()
    with open(path, "rb") as fh:
        fds.ParseFromString(fh.read())
    return list(fds.file)


class Index:
    """Messages and enums of a set of files, by fully-qualified name ('.pkg.Msg')."""

    def __init__(self, files):
        self.msgs, self.enums, self.syntax = {}, {}, {}
        for f in files:
            prefix = "." + f.package if f.package else ""
            for e in f.enum_type:
                self.enums[f"{prefix}.{e.name}"] = e
            for m in f.message_type:
                self._add(prefix, m, f.syntax or "proto2")

    def _add(self, prefix, m, syntax):
        full = f"{prefix}.{m.name}"
        self.msgs[full] = m
        self.syntax[full] = syntax
        for e in m.enum_type:
            self.enums[f"{full}.{e.name}"] = e
        for n in m.nested_type:
            self._add(full, n, syntax)


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

def wire_class(t):
    for cls, name in ((VARINT, "varint"), (ZIGZAG, "zigzag"), (FIXED32, "fixed32"),
                      (FIXED64, "fixed64"), (LENGTH, "length-delimited")):
        if t in cls:
            return name
    return "group"


def type_str(f):
    t = TYPE_NAME[f.type]
    if f.type in (F.TYPE_MESSAGE, F.TYPE_ENUM):
        t += " " + f.type_name
    lbl = "repeated " if f.label == F.LABEL_REPEATED else ""
    return lbl + t


def has_presence(f, syntax):
    """Explicit presence of a scalar field (proto3 optional, oneof, proto2)."""
    if f.type == F.TYPE_MESSAGE or f.label == F.LABEL_REPEATED:
        return False
    if f.proto3_optional or f.HasField("oneof_index"):
        return True
    return f.label == F.LABEL_OPTIONAL and syntax == "proto2"


class Checker:
    def __init__(self, ours):
        self.ours = ours
        self.errors, self.warnings, self.notes = [], [], []

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def warn(self, where, msg):
        self.warnings.append(f"{where}: {msg}")

    def compare_enum(self, where, ref_enum, our_enum):
        ours = {v.number: v.name for v in our_enum.value}
        for v in ref_enum.value:
            if v.number not in ours:
                self.err(where, f"enum value {v.name}={v.number} missing from ours")
            elif ours[v.number] != v.name:
                self.warn(where, f"enum value {v.number}: XLA calls it {v.name}, ours {ours[v.number]}")

    def compare_field(self, where, rf, of, rname, oname):
        """Returns True if the field's message type should be walked further."""
        known = KNOWN_DIVERGENCES.get((where.split("#")[0], rf.number))
        if rf.name != of.name:
            self.warn(where, f"field {rf.number}: XLA name '{rf.name}', ours '{of.name}' (JSON differs)")
        problems = []
        if (rf.label == F.LABEL_REPEATED) != (of.label == F.LABEL_REPEATED):
            problems.append(f"cardinality differs: XLA {type_str(rf)}, ours {type_str(of)}")
        rt, ot = rf.type, of.type
        walk = False
        if rt == ot:
            walk = rt == F.TYPE_MESSAGE
        elif rt == F.TYPE_MESSAGE and ot == F.TYPE_BYTES:
            self.notes.append(f"{where}.{rf.name}: {rf.type_name} carried as bytes (not checked further)")
        elif rt == F.TYPE_STRING and ot == F.TYPE_BYTES:
            self.warn(where, f"field {rf.name}={rf.number}: string in XLA, bytes in ours (JSON differs)")
        elif {rt, ot} == {F.TYPE_ENUM, F.TYPE_INT32}:
            pass
        elif wire_class(rt) == wire_class(ot) == "varint":
            if VARINT_BITS[ot] < VARINT_BITS[rt]:
                problems.append(f"narrower integer: XLA {type_str(rf)}, ours {type_str(of)} (values truncated)")
            else:
                self.warn(where, f"field {rf.name}={rf.number}: XLA {type_str(rf)}, ours {type_str(of)} "
                                 "(same wire type, different integer type)")
        else:
            problems.append(f"incompatible types: XLA {type_str(rf)}, ours {type_str(of)}")
        if has_presence(rf, self.ref.syntax[rname]) and not (
                has_presence(of, self.ours.syntax[oname]) or of.type == F.TYPE_MESSAGE):
            problems.append(f"XLA tracks presence of {rf.name} (optional/oneof), ours does not")
        for p in problems:
            if known:
                self.warn(where, f"field {rf.name}={rf.number}: {p} [known: {known}]")
            else:
                self.err(where, f"field {rf.name}={rf.number}: {p}")
        if rt == ot == F.TYPE_ENUM:
            re_, oe = self.ref.enums.get(rf.type_name), self.ours.enums.get(of.type_name)
            if re_ is not None and oe is not None:
                self.compare_enum(f"{where}.{rf.name} ({rf.type_name})", re_, oe)
        return walk and not problems

    def run(self, ref, label):
        self.ref = ref
        seen = set()
        roots = [r for r in ROOTS if "." + r in ref.msgs]
        missing_roots = [r for r in ROOTS if "." + r not in ref.msgs]
        for r in missing_roots:
            self.notes.append(f"[{label}] root {r} not in the reference; not checked from it")
        stack = []
        for r in roots:
            if "." + r not in self.ours.msgs:
                self.err(f"[{label}] .{r}", "root message missing from ours")
                continue
            stack.append(("." + r, "." + r))
        checked = 0
        while stack:
            rname, oname = stack.pop()
            if (rname, oname) in seen:
                continue
            seen.add((rname, oname))
            checked += 1
            rmsg, omsg = ref.msgs[rname], self.ours.msgs.get(oname)
            where = rname if rname == oname else f"{rname}#(ours {oname})"
            if omsg is None:
                self.err(where, "message missing from ours")
                continue
            ofields = {f.number: f for f in omsg.field}
            for rf in rmsg.field:
                of = ofields.get(rf.number)
                if of is None:
                    known = KNOWN_DIVERGENCES.get((rname, rf.number))
                    text = f"field {rf.name}={rf.number} ({type_str(rf)}) missing from ours"
                    (self.warn if known else self.err)(where, text + (f" [known: {known}]" if known else ""))
                    continue
                if self.compare_field(where, rf, of, rname, oname):
                    if rf.type_name in ref.msgs:
                        stack.append((rf.type_name, of.type_name))
        return checked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel_dir", help="unpacked tensorflow(-cpu) wheel (holds tensorflow/compiler/xla/...)")
    ap.add_argument("ours", help="our schema as a binary FileDescriptorSet (protox -o ...)")
    ap.add_argument("--ref-binary", action="append", default=[], metavar="FILE",
                    help="also check against the XLA descriptors embedded in this binary")
    ap.add_argument("--ref-fds", action="append", default=[], metavar="FILE",
                    help="also check against this binary FileDescriptorSet")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print notes")
    args = ap.parse_args(argv)

    try:
        ours = Index(load_fds(args.ours))
    except Exception as e:  # noqa: BLE001
        print(f"cannot read our FileDescriptorSet {args.ours}: {e}", file=sys.stderr)
        return 2
    if not ours.msgs:
        print(f"{args.ours} holds no messages", file=sys.stderr)
        return 2

    refs = []
    wheel_files, wheel_notes = load_wheel(args.wheel_dir)
    for n in wheel_notes:
        print(f"note: {n}")
    if not wheel_files:
        print(f"no XLA descriptors found under {args.wheel_dir}", file=sys.stderr)
        return 2
    refs.append((f"wheel {args.wheel_dir}", wheel_files))
    for b in args.ref_binary:
        got = load_binary(b)
        if not got:
            print(f"no XLA descriptors found in {b}", file=sys.stderr)
            return 2
        refs.append((f"binary {b}", got))
    for p in args.ref_fds:
        refs.append((f"fds {p}", load_fds(p)))

    failed = False
    for label, files in refs:
        ck = Checker(ours)
        n = ck.run(Index(files), label)
        print(f"== {label}: {', '.join(sorted(f.name for f in files))}")
        print(f"   {n} message types checked, {len(ck.errors)} error(s), {len(ck.warnings)} warning(s)")
        for e in ck.errors:
            print(f"   ERROR   {e}")
        for w in ck.warnings:
            print(f"   warning {w}")
        if args.verbose:
            for t in ck.notes:
                print(f"   note    {t}")
        else:
            for t in ck.notes:
                if "root" in t:
                    print(f"   note    {t}")
        failed |= bool(ck.errors)
    print("FAIL: our schema is not a superset of XLA's" if failed else "OK: our schema covers every checked XLA field")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
