//! Formats in and out: detection, the no-unknown-field guarantee, atomic
//! writes.
//!
//! equarx reads a bare `HloModuleProto` (what JAX and the PJRT transform hook
//! hand over), an `HloProto` (what `--xla_dump_hlo_as_proto` writes) and an
//! `HloModuleProtoWithConfig` (module plus replica/partition counts), each
//! optionally gzip-compressed. The container is remembered so the rewritten
//! module goes back out in the same one, with every other field intact.
//!
//! prost drops fields it does not know. Before decoding, a schema-guided walk
//! over the wire bytes proves that every field at every depth is one our
//! schema declares; an input with an unknown field is refused rather than
//! silently shortened.

use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use prost::Message;
use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};

use crate::proto::{HloModuleProto, HloModuleProtoWithConfig, HloProto};

crate::choice_enum! {
    /// The containers equarx reads and writes.
    pub enum Format {
        /// A bare `HloModuleProto` (JAX, the PJRT transform hook).
        Module = "module",
        /// An `HloProto` wrapper (`--xla_dump_hlo_as_proto`, `*.hlo.pb`).
        HloProto = "hlo-proto",
        /// An `HloModuleProtoWithConfig` (module plus its config).
        WithConfig = "with-config",
        /// HLO text, as XLA prints it.
        Text = "text",
    }
}

impl Format {
    fn message_name(self) -> &'static str {
        match self {
            Format::Module => "xla.HloModuleProto",
            Format::HloProto => "xla.HloProto",
            Format::WithConfig => "xla.HloModuleProtoWithConfig",
            Format::Text => "text",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("the input is empty")]
    Empty,
    #[error("not an HLO module: {0}")]
    NotHlo(String),
    #[error(
        "{path}: field {number} is unknown to equarx's schema; refusing to drop it (update proto/xla)"
    )]
    UnknownField { path: String, number: u32 },
    #[error("{path}: malformed protobuf: {message}")]
    Malformed { path: String, message: String },
    #[error("the module is missing from the {0:?} container")]
    NoModule(Format),
    #[error("gzip: {0}")]
    Gzip(String),
    #[error("{0}")]
    Text(String),
}

/// Where a decoded module's counts live; re-exported for callers of
/// [`decode`].
pub use crate::ir::devices::DeviceCounts;

/// A decoded input: the module plus what is needed to write it back in the
/// same container.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub module: HloModuleProto,
    pub format: Format,
    pub gzip: bool,
    pub counts: DeviceCounts,
    /// The container with its module taken out, for writing back.
    container: Container,
}

#[derive(Clone, Debug)]
enum Container {
    Bare,
    HloProto(Box<HloProto>),
    WithConfig(Box<HloModuleProtoWithConfig>),
}

/// Decodes `bytes`, detecting the container unless `format` names it.
pub fn decode(bytes: &[u8], format: Option<Format>) -> Result<Loaded, FormatError> {
    let (bytes, gzip) = gunzip(bytes)?;
    if bytes.is_empty() {
        return Err(FormatError::Empty);
    }
    // Detecting a bare module decodes it: that module is kept.
    let (format, mut decoded) = match format {
        Some(f) => (f, None),
        None => detect(&bytes)?,
    };
    let counts_from = |module: &HloModuleProto| device_assignment_counts(module);
    let loaded = match format {
        Format::Text => {
            let module = crate::text::parse(
                std::str::from_utf8(&bytes)
                    .map_err(|e| FormatError::Text(format!("HLO text is not UTF-8: {e}")))?,
            )
            .map_err(|e| FormatError::Text(e.to_string()))?;
            Loaded {
                counts: module.counts,
                module: module.proto,
                format,
                gzip,
                container: Container::Bare,
            }
        }
        Format::Module => {
            let module = match decoded.take() {
                Some(module) => module,
                None => {
                    check_known(&bytes, format)?;
                    HloModuleProto::decode(&*bytes).map_err(malformed)?
                }
            };
            Loaded {
                counts: counts_from(&module),
                module,
                format,
                gzip,
                container: Container::Bare,
            }
        }
        Format::HloProto => {
            check_known(&bytes, format)?;
            let mut wrapper = HloProto::decode(&*bytes).map_err(malformed)?;
            let module = wrapper
                .hlo_module
                .take()
                .ok_or(FormatError::NoModule(format))?;
            Loaded {
                counts: counts_from(&module),
                module,
                format,
                gzip,
                container: Container::HloProto(Box::new(wrapper)),
            }
        }
        Format::WithConfig => {
            check_known(&bytes, format)?;
            let mut wrapper = HloModuleProtoWithConfig::decode(&*bytes).map_err(malformed)?;
            let module = wrapper
                .hlo_module
                .take()
                .ok_or(FormatError::NoModule(format))?;
            let mut counts = counts_from(&module);
            if let Some(c) = &wrapper.config {
                // The config is authoritative where it is set (XLA's defaults
                // are 1 replica, 1 partition, written as 0 or 1).
                counts.replica_count = Some(c.replica_count.max(1));
                counts.num_partitions = Some(c.num_partitions.max(1));
            }
            Loaded {
                counts,
                module,
                format,
                gzip,
                container: Container::WithConfig(Box::new(wrapper)),
            }
        }
    };
    Ok(loaded)
}

fn malformed(e: prost::DecodeError) -> FormatError {
    FormatError::Malformed {
        path: String::new(),
        message: e.to_string(),
    }
}

/// Counts from the module's static device assignment, if it has one.
fn device_assignment_counts(module: &HloModuleProto) -> DeviceCounts {
    match &module.device_assignment {
        Some(da) if da.replica_count > 0 && da.computation_count > 0 => DeviceCounts {
            replica_count: Some(i64::from(da.replica_count)),
            num_partitions: Some(i64::from(da.computation_count)),
        },
        _ => DeviceCounts::default(),
    }
}

impl Loaded {
    /// Wraps a module that did not come from a file (tests, the C ABI).
    pub fn bare(module: HloModuleProto) -> Self {
        Loaded {
            counts: device_assignment_counts(&module),
            module,
            format: Format::Module,
            gzip: false,
            container: Container::Bare,
        }
    }

    /// Encodes `module` in `format` (its own container when `None`); binary
    /// formats other than the input's own lose nothing but the wrapper.
    /// Text names `counts` in its header (a rewrite's counts:
    /// [`crate::Rewritten::counts`], which options may have set).
    pub fn encode(
        &self,
        module: &HloModuleProto,
        format: Option<Format>,
        gzip: bool,
        counts: &DeviceCounts,
    ) -> Result<Vec<u8>, FormatError> {
        let format = format.unwrap_or(self.format);
        let bytes = match format {
            Format::Module => module.encode_to_vec(),
            Format::HloProto => {
                let mut w = match &self.container {
                    Container::HloProto(w) => (**w).clone(),
                    _ => HloProto::default(),
                };
                w.hlo_module = Some(module.clone());
                w.encode_to_vec()
            }
            Format::WithConfig => {
                let mut w = match &self.container {
                    Container::WithConfig(w) => (**w).clone(),
                    _ => HloModuleProtoWithConfig::default(),
                };
                w.hlo_module = Some(module.clone());
                w.encode_to_vec()
            }
            Format::Text => {
                let text = crate::text::print_module(module, counts)
                    .map_err(|e| FormatError::Text(e.to_string()))?;
                text.into_bytes()
            }
        };
        if gzip { gzip_bytes(&bytes) } else { Ok(bytes) }
    }
}

/// The most bytes a gzip input may inflate to: protobuf's 2 GiB message
/// limit. More is a decompression bomb, refused before it exhausts memory.
pub const MAX_INFLATED: u64 = 2 << 30;

fn gunzip(bytes: &[u8]) -> Result<(std::borrow::Cow<'_, [u8]>, bool), FormatError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        let decoder = flate2::read::MultiGzDecoder::new(bytes);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(decoder, MAX_INFLATED + 1),
            &mut out,
        )
        .map_err(|e| FormatError::Gzip(e.to_string()))?;
        if out.len() as u64 > MAX_INFLATED {
            return Err(FormatError::Gzip(format!(
                "inflates to more than {MAX_INFLATED} bytes (protobuf's 2 GiB limit)"
            )));
        }
        Ok((out.into(), true))
    } else {
        Ok((bytes.into(), false))
    }
}

fn gzip_bytes(bytes: &[u8]) -> Result<Vec<u8>, FormatError> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes)
        .map_err(|e| FormatError::Gzip(e.to_string()))?;
    enc.finish().map_err(|e| FormatError::Gzip(e.to_string()))
}

/// Which container `bytes` hold, and the module where they hold a bare one
/// (decoded to tell). A bare module has a computations list (field 3); the
/// wrappers hold a whole module in field 1.
fn detect(bytes: &[u8]) -> Result<(Format, Option<HloModuleProto>), FormatError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if bytes.len() >= 9 && first == Some(b'H') || looks_like_text(bytes) {
        return Ok((Format::Text, None));
    }
    if check_known(bytes, Format::Module).is_ok()
        && let Ok(module) = HloModuleProto::decode(bytes)
        && !module.computations.is_empty()
    {
        return Ok((Format::Module, Some(module)));
    }
    // A dump wrapper and a module-with-config both hold the module in field
    // 1; only the latter has field 2, which the wrapper's schema reserves.
    for f in [Format::HloProto, Format::WithConfig] {
        if check_known(bytes, f).is_ok() {
            let has_module = match f {
                Format::HloProto => HloProto::decode(bytes).ok().and_then(|w| w.hlo_module),
                _ => HloModuleProtoWithConfig::decode(bytes)
                    .ok()
                    .and_then(|w| w.hlo_module),
            };
            if has_module.is_some_and(|m| !m.computations.is_empty()) {
                return Ok((f, None));
            }
        }
    }
    // Name the most likely reason: what a bare module decode says.
    Err(match check_known(bytes, Format::Module) {
        Err(e @ FormatError::UnknownField { .. }) => e,
        Err(e) => FormatError::NotHlo(e.to_string()),
        Ok(()) => {
            FormatError::NotHlo("the bytes decode as protobuf but hold no HLO computations".into())
        }
    })
}

fn looks_like_text(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(4096)];
    std::str::from_utf8(head)
        .ok()
        .map(|s| s.trim_start())
        .is_some_and(|s| s.starts_with("HloModule") || s.starts_with("//") || s.starts_with("/*"))
}

/// Proves that every field in `bytes`, at every depth, is declared in our
/// schema for `format`'s message (and that the wire types agree).
pub fn check_known(bytes: &[u8], format: Format) -> Result<(), FormatError> {
    let schema = schema();
    let top = schema.index[format.message_name()];
    let mut path = Vec::new();
    walk(schema, bytes, top, &mut path).map_err(|(fault, depth)| {
        // The path is spelled out only for the error: the message, then
        // the field that led into each nested one.
        let mut p = schema.messages[top].name.clone();
        for &(message, number) in &path[..depth] {
            p.push('.');
            p.push_str(
                schema
                    .field(message, number)
                    .map_or("?", |f| f.name.as_str()),
            );
        }
        match fault {
            Fault::Unknown(number) => FormatError::UnknownField { path: p, number },
            Fault::Malformed(message) => FormatError::Malformed { path: p, message },
        }
    })
}

const MAX_DEPTH: usize = 100;

/// Equarx's schema as [`walk`] reads it: each message's fields by number,
/// made once from the descriptor set compiled in.
struct Schema {
    messages: Vec<MessageFields>,
    index: std::collections::HashMap<String, usize>,
}

struct MessageFields {
    name: String,
    /// Indexed by field number; `None` for a number the message does not
    /// declare.
    by_number: Vec<Option<FieldInfo>>,
}

struct FieldInfo {
    name: String,
    kind: FieldKind,
}

/// What a field's wire bytes must be.
#[derive(Clone, Copy, PartialEq)]
enum FieldKind {
    /// A nested message: the index of its [`MessageFields`].
    Message(usize),
    String,
    Bytes,
    /// 8 bytes (double, fixed64, sfixed64), or packed.
    Fixed64,
    /// 4 bytes (float, fixed32, sfixed32), or packed.
    Fixed32,
    /// A varint (integers, bools, enums), or packed.
    Varint,
}

impl Schema {
    fn field(&self, message: usize, number: u32) -> Option<&FieldInfo> {
        self.messages[message]
            .by_number
            .get(number as usize)?
            .as_ref()
    }
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        // Built in: a failure is a build of equarx gone wrong, found by
        // every test that reads a module.
        let pool = DescriptorPool::decode(crate::proto::DESCRIPTOR_SET)
            .expect("the descriptor set compiled into equarx decodes");
        let all: Vec<MessageDescriptor> = pool.all_messages().collect();
        let index: std::collections::HashMap<String, usize> = all
            .iter()
            .enumerate()
            .map(|(k, m)| (m.full_name().to_string(), k))
            .collect();
        let messages = all
            .iter()
            .map(|m| {
                let mut by_number: Vec<Option<FieldInfo>> = Vec::new();
                for f in m.fields() {
                    let kind = match f.kind() {
                        Kind::Message(inner) => FieldKind::Message(index[inner.full_name()]),
                        Kind::String => FieldKind::String,
                        Kind::Bytes => FieldKind::Bytes,
                        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => FieldKind::Fixed64,
                        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => FieldKind::Fixed32,
                        _ => FieldKind::Varint,
                    };
                    let n = f.number() as usize;
                    if by_number.len() <= n {
                        by_number.resize_with(n + 1, || None);
                    }
                    by_number[n] = Some(FieldInfo {
                        name: f.name().to_string(),
                        kind,
                    });
                }
                MessageFields {
                    name: m.name().to_string(),
                    by_number,
                }
            })
            .collect();
        Schema { messages, index }
    })
}

/// Why [`walk`] stopped.
enum Fault {
    Unknown(u32),
    Malformed(String),
}

/// Walks message `message`'s bytes `b`, `path` the (message, field number)
/// steps that led here; a fault comes back with the depth it was found at
/// (the steps of `path` that lead to it).
fn walk(
    schema: &Schema,
    mut b: &[u8],
    message: usize,
    path: &mut Vec<(usize, u32)>,
) -> Result<(), (Fault, usize)> {
    let depth = path.len();
    let fault = |message: &str| Err((Fault::Malformed(message.to_string()), depth));
    if depth > MAX_DEPTH {
        return fault("nested more than 100 messages deep");
    }
    while !b.is_empty() {
        let Some(key) = varint(&mut b) else {
            return fault("truncated field key");
        };
        let number = (key >> 3) as u32;
        let wire = (key & 7) as u8;
        if number == 0 {
            return fault("field number 0");
        }
        let Some(field) = schema.field(message, number) else {
            return Err((Fault::Unknown(number), depth));
        };
        match wire {
            0 => {
                if varint(&mut b).is_none() {
                    return fault("truncated varint");
                }
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if b.len() < n {
                    return fault("truncated fixed-width value");
                }
                b = &b[n..];
            }
            2 => {
                let Some(len) = varint(&mut b) else {
                    return fault("truncated length");
                };
                let Some(len) = usize::try_from(len).ok().filter(|&l| l <= b.len()) else {
                    return fault("length runs past the end");
                };
                let (payload, rest) = b.split_at(len);
                b = rest;
                match field.kind {
                    FieldKind::Message(inner) => {
                        path.push((message, number));
                        walk(schema, payload, inner, path)?;
                        path.pop();
                    }
                    FieldKind::String if std::str::from_utf8(payload).is_err() => {
                        return fault(&format!("field {} is not UTF-8", field.name));
                    }
                    _ => {}
                }
            }
            _ => return fault(&format!("unsupported wire type {wire}")),
        }
        let wire_ok = match field.kind {
            FieldKind::Message(_) | FieldKind::String | FieldKind::Bytes => wire == 2,
            FieldKind::Fixed64 => wire == 1 || wire == 2,
            FieldKind::Fixed32 => wire == 5 || wire == 2,
            FieldKind::Varint => wire == 0 || wire == 2,
        };
        if !wire_ok {
            return fault(&format!("field {} has wire type {wire}", field.name));
        }
    }
    Ok(())
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(i)?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *b = &b[i + 1..];
            return Some(v);
        }
    }
    None
}

/// Reads `path`, or standard input for `-`.
pub fn read_path(path: &Path) -> std::io::Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
        Ok(v)
    } else {
        std::fs::read(path)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so `path` is either the old file or the whole new one.
/// `-` writes to standard output.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        return out.flush();
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // A replaced file keeps its permissions; a new one gets the usual
    // rw-r--r-- (the temporary file is created private).
    let mode = std::fs::metadata(path).map(|m| m.permissions()).ok();
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    let perms = mode.unwrap_or_else(|| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(0o644)
    });
    tmp.as_file().set_permissions(perms)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The output format a file name asks for: `.txt`/`.hlo` → text,
/// `.gz` → gzip of what the rest of the name asks for.
pub fn format_from_extension(path: &Path) -> (Option<Format>, bool) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let (name, gzip) = match name.strip_suffix(".gz") {
        Some(n) => (n, true),
        None => (name, false),
    };
    let format = if name.ends_with(".txt") || name.ends_with(".hlo") {
        Some(Format::Text)
    } else {
        None
    };
    (format, gzip)
}
