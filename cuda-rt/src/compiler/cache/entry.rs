//! One kernel-cache entry: its key ([`cache_key`], a 128-bit BLAKE3 hash of everything
//! that changes the compile) and its file format ([`encode`] / [`decode`]): a header
//! (magic, format version, key, architecture, output kind, payload length), the
//! payload (image, log, lowered names) and a checksum, XXH3-128 over everything before
//! it ([`checksum`]). Pure functions: no file, no NVRTC.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::super::hash::{hex, hex_to, StableHash};
use super::super::toolkit::IncludeSet;
use super::super::{Compiled, Output, Program, Target};

/// The disk cache key of a program: 16 bytes, the first 128 bits of a BLAKE3 hash
/// (see [`cache_key_with_includes`]); its file name is 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(pub [u8; 16]);

impl CacheKey {
    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The cache file's name: `<hex>.kcache`.
    pub fn file_name(&self) -> String {
        self.name_bytes().iter().map(|&b| char::from(b)).collect()
    }

    /// The path of the cache file in `dir`, built in one allocation (every disk lookup
    /// names its file; `dir.join(file_name())` made four).
    pub(crate) fn path_in(&self, dir: &Path) -> PathBuf {
        let name = self.name_bytes();
        let mut path = PathBuf::with_capacity(dir.as_os_str().len() + 1 + name.len());
        path.push(dir);
        path.push(OsStr::from_bytes(&name));
        path
    }

    /// [`file_name`](Self::file_name)'s bytes (ASCII).
    fn name_bytes(&self) -> [u8; NAME_LEN] {
        let mut name = [0u8; NAME_LEN];
        hex_to(&mut name[..2 * self.0.len()], &self.0);
        name[2 * self.0.len()..].copy_from_slice(FILE_SUFFIX.as_bytes());
        name
    }
}

/// The key of `program` compiled for `target` by NVRTC `nvrtc_version`, with the
/// toolkit include folders it gets in this process ([`Program::include_set`], found
/// once): [`cache_key_with_includes`] of those, with what the key takes of the folders
/// ([`IncludeSet::key_bytes`]) also worked out once per process.
pub fn cache_key(program: &Program<'_>, target: Target, nvrtc_version: (i32, i32)) -> CacheKey {
    key_of(program, target, nvrtc_version, program.include_key())
}

/// The key of `program` compiled for `target` by NVRTC `nvrtc_version` with the toolkit
/// include folders `includes`: the first 16 bytes of BLAKE3 over a domain string
/// (`cuda-rt kernel cache key v2`), the source, source name, options, name
/// expressions, architecture, output kind and NVRTC version, each length-prefixed
/// (little-endian `u64`) where its length varies. With an include set, the folders and
/// their stamp ([`IncludeSet::key_bytes`]) are hashed in too, so the key changes when
/// the folders, or the headers in them, change; not for a program that reads no header
/// (neither its source nor an option names `include`), which the folders cannot
/// change. Pure.
pub fn cache_key_with_includes(
    program: &Program<'_>,
    target: Target,
    nvrtc_version: (i32, i32),
    includes: Option<&IncludeSet>,
) -> CacheKey {
    key_of(
        program,
        target,
        nvrtc_version,
        includes.map(IncludeSet::key_bytes).as_deref(),
    )
}

/// [`cache_key_with_includes`] given the include set's [`IncludeSet::key_bytes`].
fn key_of(
    program: &Program<'_>,
    target: Target,
    nvrtc_version: (i32, i32),
    include_key: Option<&[u8]>,
) -> CacheKey {
    let mut h = StableHash::new();
    // v2: BLAKE3 (v1, FNV-1a, keys no longer match: those entries are never looked up).
    h.field(b"cuda-rt kernel cache key v2");
    h.field(program.source.as_bytes());
    h.field(program.source_name.as_bytes());
    h.write(&(program.options.len() as u64).to_le_bytes());
    for o in program.options {
        h.field(o.as_bytes());
    }
    h.write(&(program.name_expressions.len() as u64).to_le_bytes());
    for e in program.name_expressions {
        h.field(e.as_bytes());
    }
    h.write(&target.arch.to_le_bytes());
    h.write(&[output_byte(target.output)]);
    h.write(&nvrtc_version.0.to_le_bytes());
    h.write(&nvrtc_version.1.to_le_bytes());
    // A program that reads no header compiles the same with any folders: they are
    // left out, as `Program::include_key` leaves them out for the warm lookup.
    if let Some(set_key) = include_key.filter(|_| program.may_include()) {
        h.field(b"toolkit include folders");
        h.field(set_key);
    }
    // NVRTC programs keep the key they had before backends; nvcc's adds its identity.
    if program.backend == super::super::Backend::Nvcc {
        h.field(b"backend nvcc");
        if let Ok(p) = super::super::find_nvcc() {
            h.field(&super::super::nvcc::nvcc_identity(&p));
        }
    }
    CacheKey(h.finish())
}

/// What ends a cache file's name, after the key's hex digits.
const FILE_SUFFIX: &str = ".kcache";
/// Length of a cache file's name.
const NAME_LEN: usize = 32 + FILE_SUFFIX.len();

/// First bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"CURTKC\r\n";
/// Version of the file layout: 5 ends with an XXH3-128 checksum ([`checksum`]). The
/// earlier ones are read as misses (and rewritten): 4, 3 and 2 ended with a BLAKE3 tag
/// keyed with a per-user secret (`kcache.secret`, no longer made or read), 1 with an
/// FNV-1a checksum.
pub const FORMAT_VERSION: u32 = 5;
/// Length of an entry's checksum, in bytes.
pub const CHECKSUM_LEN: usize = 16;
/// magic 8, version 4, key 16, arch 4, output 1, pad 3, payload length 8.
const HEADER_LEN: usize = 44;

fn output_byte(o: Output) -> u8 {
    match o {
        Output::Cubin => 0,
        Output::Ptx => 1,
    }
}

/// Why a cache file was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unusable kernel cache file: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// The checksum ending an entry: XXH3-128 of `bytes` (the entry before it), its 16
/// bytes little-endian. It tells a torn, truncated or damaged file from a whole one; it
/// is not a MAC (who may write the folder is the folder check's question). Pure.
pub fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_LEN] {
    xxhash_rust::xxh3::xxh3_128(bytes).to_le_bytes()
}

/// The bytes of a cache file for `compiled` under `key`. Pure.
pub fn encode(key: &CacheKey, compiled: &Compiled) -> Vec<u8> {
    let mut payload = Vec::with_capacity(compiled.image.len() + compiled.log.len() + 64);
    put_bytes(&mut payload, &compiled.image);
    put_bytes(&mut payload, compiled.log.as_bytes());
    payload.extend_from_slice(&(compiled.lowered_names.len() as u64).to_le_bytes());
    for (e, l) in &compiled.lowered_names {
        put_bytes(&mut payload, e.as_bytes());
        put_bytes(&mut payload, l.as_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + CHECKSUM_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.0);
    out.extend_from_slice(&compiled.arch.to_le_bytes());
    out.extend_from_slice(&[output_byte(compiled.output), 0, 0, 0]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let sum = checksum(&out);
    out.extend_from_slice(&sum);
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads a cache file's bytes back, checking magic, version, key, length and the
/// checksum before anything of the payload is used. Never panics, whatever the bytes.
/// Pure.
pub fn decode(bytes: &[u8], key: &CacheKey) -> Result<Compiled, DecodeError> {
    let head = checked_body(bytes, key)?;
    let (image, rest) = parsed_body(&bytes[..head.body_end], head)?;
    Ok(rest.with_image(bytes[image].to_vec()))
}

/// [`decode`] of a file's bytes read into `bytes`: the image is moved to the front of
/// that buffer and kept there, rather than copied into a new one.
pub(crate) fn decode_owned(mut bytes: Vec<u8>, key: &CacheKey) -> Result<Compiled, DecodeError> {
    let head = checked_body(&bytes, key)?;
    let (image, rest) = parsed_body(&bytes[..head.body_end], head)?;
    let len = image.len();
    bytes.copy_within(image, 0);
    bytes.truncate(len);
    Ok(rest.with_image(bytes))
}

/// [`checked_header`], then the checksum over the header and payload.
fn checked_body(bytes: &[u8], key: &CacheKey) -> Result<Header, DecodeError> {
    let head = checked_header(bytes, key)?;
    if checksum(&bytes[..head.body_end])[..] != bytes[head.body_end..] {
        return Err(DecodeError(
            "the checksum does not match (torn, truncated or damaged)",
        ));
    }
    Ok(head)
}

/// A decoded entry but for its image.
struct Parts {
    output: Output,
    arch: u32,
    log: String,
    lowered_names: Vec<(String, String)>,
}

impl Parts {
    fn with_image(self, image: Vec<u8>) -> Compiled {
        Compiled {
            image,
            output: self.output,
            arch: self.arch,
            log: self.log,
            lowered_names: self.lowered_names,
        }
    }
}

/// What a file's header says, checked against the file's length and the key.
#[derive(Clone, Copy)]
struct Header {
    arch: u32,
    output: Output,
    /// Where the body (header and payload) ends and the checksum begins.
    body_end: usize,
}

/// [`decode`]'s checks before the checksum's: magic, version, key, kind and length.
fn checked_header(bytes: &[u8], key: &CacheKey) -> Result<Header, DecodeError> {
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(DecodeError("shorter than its header (truncated)"));
    }
    if bytes[..8] != MAGIC {
        return Err(DecodeError("bad magic"));
    }
    let mut r = Reader {
        b: &bytes[8..HEADER_LEN],
    };
    if r.u32()? != FORMAT_VERSION {
        return Err(DecodeError("another format version"));
    }
    if r.take(16)? != key.0 {
        return Err(DecodeError("written for another key"));
    }
    let arch = r.u32()?;
    let output = match r.take(4)?[0] {
        0 => Output::Cubin,
        1 => Output::Ptx,
        _ => return Err(DecodeError("unknown output kind")),
    };
    let payload_len = r.u64()?;
    let body_end = bytes.len() - CHECKSUM_LEN;
    if payload_len != (body_end - HEADER_LEN) as u64 {
        return Err(DecodeError("length does not match (truncated or extended)"));
    }
    Ok(Header {
        arch,
        output,
        body_end,
    })
}

/// [`decode`]'s parse of a checked `body` (header and payload): where the image is in
/// it, and the rest.
fn parsed_body(body: &[u8], head: Header) -> Result<(std::ops::Range<usize>, Parts), DecodeError> {
    let mut r = Reader {
        b: &body[HEADER_LEN..head.body_end],
    };
    let image_len = r.bytes()?.len();
    // The image's length field is eight bytes after the header: the image follows it.
    let image_start = HEADER_LEN + 8;
    let log = r.string()?;
    let n = r.u64()?;
    let mut lowered_names = Vec::new();
    for _ in 0..n {
        lowered_names.push((r.string()?, r.string()?));
    }
    if !r.b.is_empty() {
        return Err(DecodeError("trailing bytes in the payload"));
    }
    let parts = Parts {
        output: head.output,
        arch: head.arch,
        log,
        lowered_names,
    };
    Ok((image_start..image_start + image_len, parts))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError("a field runs past the end"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(self.u64()?).map_err(|_| DecodeError("field too long"))?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError("text is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Compiled {
        Compiled {
            image: vec![0x7f, b'E', b'L', b'F', 1, 2, 3],
            output: Output::Cubin,
            arch: 90,
            log: "warning: something".into(),
            lowered_names: vec![("k<float>".into(), "_Z1kIfEvv".into())],
        }
    }

    #[test]
    fn cache_key_is_stable_across_builds() {
        let p = Program::new("extern \"C\" __global__ void k() {}").options(&["-O3"]);
        let k = cache_key_with_includes(&p, Target::cubin(90), (13, 0), None);
        // A fixed value, computed independently (Python's `blake3` package) from the
        // layout documented on `cache_key_with_includes`: changing it invalidates every
        // user's disk cache.
        assert_eq!(k.to_hex(), "ae8d11b7249119da2befedb16e7342b7");
        assert_eq!(k.to_hex().len(), 32);
        assert_eq!(k.file_name(), format!("{}.kcache", k.to_hex()));
    }

    #[test]
    fn cache_key_changes_with_the_include_set() {
        use super::super::super::toolkit::PlaceSource;
        let p = Program::new("#include <cub/cub.cuh>");
        let t = Target::cubin(90);
        let set = |dirs: &[&str], stamp: u128| IncludeSet {
            dirs: dirs.iter().map(std::path::PathBuf::from).collect(),
            source: PlaceSource::CudaPath,
            stamp,
        };
        let none = cache_key_with_includes(&p, t, (13, 0), None);
        let a = cache_key_with_includes(&p, t, (13, 0), Some(&set(&["/tk/include"], 1)));
        assert_ne!(none, a);
        assert_eq!(
            a,
            cache_key_with_includes(&p, t, (13, 0), Some(&set(&["/tk/include"], 1)))
        );
        assert_ne!(
            a,
            cache_key_with_includes(&p, t, (13, 0), Some(&set(&["/tk/include"], 2))),
            "headers changed in place"
        );
        assert_ne!(
            a,
            cache_key_with_includes(
                &p,
                t,
                (13, 0),
                Some(&set(&["/tk/include", "/tk/include/cccl"], 1))
            ),
            "another folder"
        );
        assert_ne!(
            a,
            cache_key_with_includes(&p, t, (13, 0), Some(&set(&["/other/include"], 1))),
            "another installation"
        );
        // Turned off on the program: the key of no include set.
        assert_eq!(cache_key(&p.toolkit_includes(false), t, (13, 0)), none);
    }

    #[test]
    fn a_program_that_reads_no_header_is_keyed_without_the_include_folders() {
        use super::super::super::toolkit::PlaceSource;
        let t = Target::cubin(90);
        let set = IncludeSet {
            dirs: vec!["/tk/include".into()],
            source: PlaceSource::CudaPath,
            stamp: 7,
        };
        let plain = Program::new("extern \"C\" __global__ void k(float* x) { x[0] = 1; }");
        assert!(!plain.may_include());
        // The folders cannot change it: the same key with or without them, and the
        // warm lookup's key neither finds nor stamps them.
        assert_eq!(
            cache_key_with_includes(&plain, t, (13, 0), Some(&set)),
            cache_key_with_includes(&plain, t, (13, 0), None)
        );
        assert_eq!(plain.include_key(), None);
        assert_eq!(
            cache_key(&plain, t, (13, 0)),
            cache_key_with_includes(&plain, t, (13, 0), None)
        );
        // Each way of reading a header keeps them in the key.
        for src in [
            "#include <cuda_fp16.h>",
            "#  include_next <x.h>",
            "#if __has_include(<x.h>)\n#endif",
            "#import <x.h>",
            "const char d[] = {\n#embed \"d.bin\"\n};",
        ] {
            let p = Program::new(src);
            assert!(p.may_include(), "{src}");
            assert_ne!(
                cache_key_with_includes(&p, t, (13, 0), Some(&set)),
                cache_key_with_includes(&p, t, (13, 0), None),
                "{src}"
            );
        }
        for opts in [&["-include=x.h"][..], &["--pre-include=x.h"][..]] {
            let p = plain.options(opts);
            assert!(p.may_include(), "{opts:?}");
            assert_ne!(
                cache_key_with_includes(&p, t, (13, 0), Some(&set)),
                cache_key_with_includes(&p, t, (13, 0), None),
                "{opts:?}"
            );
        }
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let base = Program::new("src")
            .options(&["-a"])
            .name_expressions(&["f<int>"]);
        let k = |p: &Program<'_>, t: Target, v: (i32, i32)| cache_key_with_includes(p, t, v, None);
        let k0 = k(&base, Target::cubin(90), (13, 0));
        assert_ne!(k0, k(&base.options(&["-b"]), Target::cubin(90), (13, 0)));
        assert_ne!(
            k0,
            k(&base.options(&["-a", ""]), Target::cubin(90), (13, 0))
        );
        assert_ne!(
            k0,
            k(
                &Program {
                    source: "src2",
                    ..base
                },
                Target::cubin(90),
                (13, 0)
            )
        );
        assert_ne!(
            k0,
            k(&base.name_expressions(&[]), Target::cubin(90), (13, 0))
        );
        assert_ne!(k0, k(&base.source_name("x.cu"), Target::cubin(90), (13, 0)));
        assert_ne!(k0, k(&base, Target::cubin(80), (13, 0)));
        assert_ne!(k0, k(&base, Target::ptx(90), (13, 0)));
        assert_ne!(k0, k(&base, Target::cubin(90), (12, 9)));
        // Field boundaries matter: ["ab"] is not ["a", "b"].
        assert_ne!(
            k(&base.options(&["ab"]), Target::cubin(90), (13, 0)),
            k(&base.options(&["a", "b"]), Target::cubin(90), (13, 0))
        );
    }

    #[test]
    fn path_in_is_the_file_name_joined_to_the_folder() {
        let k = CacheKey([0xa7; 16]);
        for dir in ["/c/kernels", "/c/kernels/", "rel", "", "/"] {
            assert_eq!(
                k.path_in(Path::new(dir)),
                Path::new(dir).join(k.file_name())
            );
        }
    }

    #[test]
    fn decode_owned_is_decode() {
        let key = CacheKey([7; 16]);
        let bytes = encode(&key, &sample());
        assert_eq!(decode_owned(bytes.clone(), &key), decode(&bytes, &key));
        assert_eq!(decode_owned(bytes, &key), Ok(sample()));
    }

    #[test]
    fn encode_decode_round_trips() {
        let key = CacheKey([7; 16]);
        let c = sample();
        assert_eq!(decode(&encode(&key, &c), &key), Ok(c));
    }

    #[test]
    fn every_truncation_is_a_decode_error() {
        let key = CacheKey([1; 16]);
        let bytes = encode(&key, &sample());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n], &key).is_err(), "truncated at {n}");
        }
    }

    #[test]
    fn every_flipped_byte_is_a_decode_error() {
        let key = CacheKey([1; 16]);
        let bytes = encode(&key, &sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(decode(&b, &key).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn a_file_for_another_key_is_a_miss() {
        let bytes = encode(&CacheKey([1; 16]), &sample());
        assert_eq!(
            decode(&bytes, &CacheKey([2; 16])),
            Err(DecodeError("written for another key"))
        );
    }

    #[test]
    fn a_checksum_that_does_not_match_is_a_miss() {
        let key = CacheKey([3; 16]);
        let mut bytes = encode(&key, &sample());
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        assert_eq!(
            decode(&bytes, &key),
            Err(DecodeError(
                "the checksum does not match (torn, truncated or damaged)"
            ))
        );
    }

    /// The checksum is XXH3-128 as its reference computes it: fixed values (the
    /// `xxhash` C library's `XXH3_128bits`, through Python's `xxhash` package), so a
    /// change of crate or of byte order cannot pass unseen and turn every user's
    /// entries into misses. The empty input, a short one, and 5000 bytes (the long
    /// input path, which every cubin takes).
    #[test]
    fn the_checksum_is_xxh3_128_little_endian() {
        assert_eq!(
            checksum(b""),
            0x99aa06d3014798d86001c324468d497fu128.to_le_bytes()
        );
        assert_eq!(
            checksum(b"CURTKC"),
            0x1012ec8fdc0ccb83491d6a4aa4db1ebeu128.to_le_bytes()
        );
        let long: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(
            checksum(&long),
            0x5ecbf80121973a82ce29a19460ee1bfcu128.to_le_bytes()
        );
    }
}
