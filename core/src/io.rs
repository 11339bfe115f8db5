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

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(crate::proto::DESCRIPTOR_SET)
            .expect("the descriptor set compiled into equarx decodes")
    })
}

fn descriptor(name: &str) -> MessageDescriptor {
    pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("{name} is in equarx's schema"))
}

/// Decodes `bytes`, detecting the container unless `format` names it.
pub fn decode(bytes: &[u8], format: Option<Format>) -> Result<Loaded, FormatError> {
    let (bytes, gzip) = gunzip(bytes)?;
    if bytes.is_empty() {
        return Err(FormatError::Empty);
    }
    let format = match format {
        Some(f) => f,
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
            check_known(&bytes, format)?;
            let module = HloModuleProto::decode(&*bytes).map_err(malformed)?;
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

/// Which container `bytes` hold. A bare module has a computations list
/// (field 3); the wrappers hold a whole module in field 1.
fn detect(bytes: &[u8]) -> Result<Format, FormatError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if bytes.len() >= 9 && first == Some(b'H') || looks_like_text(bytes) {
        return Ok(Format::Text);
    }
    let module_ok = check_known(bytes, Format::Module).is_ok()
        && HloModuleProto::decode(bytes).is_ok_and(|m| !m.computations.is_empty());
    if module_ok {
        return Ok(Format::Module);
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
                return Ok(f);
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
    let desc = descriptor(format.message_name());
    let mut path = desc.name().to_string();
    walk(bytes, &desc, &mut path, 0)
}

const MAX_DEPTH: usize = 100;

fn walk(
    mut b: &[u8],
    desc: &MessageDescriptor,
    path: &mut String,
    depth: usize,
) -> Result<(), FormatError> {
    let err = |path: &str, message: &str| FormatError::Malformed {
        path: path.to_string(),
        message: message.to_string(),
    };
    if depth > MAX_DEPTH {
        return Err(err(path, "nested more than 100 messages deep"));
    }
    while !b.is_empty() {
        let key = varint(&mut b).ok_or_else(|| err(path, "truncated field key"))?;
        let number = (key >> 3) as u32;
        let wire = (key & 7) as u8;
        if number == 0 {
            return Err(err(path, "field number 0"));
        }
        let Some(field) = desc.get_field(number) else {
            return Err(FormatError::UnknownField {
                path: path.clone(),
                number,
            });
        };
        match wire {
            0 => {
                varint(&mut b).ok_or_else(|| err(path, "truncated varint"))?;
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if b.len() < n {
                    return Err(err(path, "truncated fixed-width value"));
                }
                b = &b[n..];
            }
            2 => {
                let len = varint(&mut b).ok_or_else(|| err(path, "truncated length"))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= b.len())
                    .ok_or_else(|| err(path, "length runs past the end"))?;
                let (payload, rest) = b.split_at(len);
                b = rest;
                let kind = field.kind();
                if let Kind::Message(inner) = kind {
                    let len_before = path.len();
                    path.push('.');
                    path.push_str(field.name());
                    // Map entries name their value field "value".
                    walk(payload, &inner, path, depth + 1)?;
                    path.truncate(len_before);
                } else if matches!(kind, Kind::String) && std::str::from_utf8(payload).is_err() {
                    return Err(err(path, &format!("field {} is not UTF-8", field.name())));
                }
            }
            _ => return Err(err(path, &format!("unsupported wire type {wire}"))),
        }
        let wire_ok = match field.kind() {
            Kind::Message(_) | Kind::String | Kind::Bytes => wire == 2,
            Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => wire == 1 || wire == 2,
            Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => wire == 5 || wire == 2,
            _ => wire == 0 || wire == 2,
        };
        if !wire_ok {
            return Err(err(
                path,
                &format!("field {} has wire type {wire}", field.name()),
            ));
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
