//! The build phase's strip step: the wheel ships its extension without debug info, and the debug
//! info becomes a release asset of its own (`<wheel stem>.debug`, GitHub only).
//!
//! `objcopy --only-keep-debug` writes the debug file (DWARF, `.symtab`, the GNU build-id note);
//! `objcopy --strip-unneeded --add-gnu-debuglink=<asset>` strips the `.so` and names the asset
//! with its CRC-32. The `.so` keeps its build-id, so a crash report symbolizes with the asset
//! either next to the `.so` or as `/usr/lib/debug/.build-id/xx/yyyy.debug`. Both tools are
//! binutils' (the builder's own); their output depends on their input only, so the step keeps
//! the build reproducible. The wheel is rewritten by `wheel_so.py` (member order, times, modes
//! and compression kept; RECORD updated).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::Serialize;
use xshell::{cmd, Shell};

const WHEEL_SO: &str = include_str!("wheel_so.py");

/// What the strip step did, for the manifest.
#[derive(Debug, Clone, Serialize)]
pub struct Stripped {
    /// The extension's path in the wheel.
    pub member: String,
    /// The debug file's name: the release asset `.gnu_debuglink` names.
    pub debug_file: String,
    /// The GNU build-id both files carry, hex.
    pub build_id: String,
    pub wheel_size_before: u64,
    pub wheel_size_after: u64,
    pub so_size_before: u64,
    pub so_size_after: u64,
    #[serde(skip)]
    pub debug: PathBuf,
}

/// Strips the one extension module of `wheel` in place and writes its debug info to
/// `out/<wheel stem>.debug`. `python` runs `wheel_so.py` (stdlib only); `work` is scratch.
pub fn strip_wheel(
    sh: &Shell,
    python: &Path,
    wheel: &Path,
    out: &Path,
    work: &Path,
) -> anyhow::Result<Stripped> {
    let wheel_name = crate::checksums::file_name(wheel)?;
    let stem = wheel_name
        .strip_suffix(".whl")
        .ok_or_else(|| format_err!("{wheel_name} is not a wheel"))?;
    let debug_file = format!("{stem}.debug");
    let debug = out.join(&debug_file);
    if work.exists() {
        fs::remove_dir_all(work)?;
    }
    fs::create_dir_all(work)?;
    let wheel_size_before = fs::metadata(wheel)?.len();

    let listed = cmd!(sh, "{python} -I -c {WHEEL_SO} extract {wheel} {work}")
        .quiet()
        .read()
        .context("cannot extract the extension module from the wheel")?;
    let members: Vec<String> = serde_json::from_str(&listed)?;
    let [member] = &members[..] else {
        bail!("expected one extension module (*.so) in {wheel_name}, found {members:?}");
    };
    let so = work.join(member);
    let so_size_before = fs::metadata(&so)?.len();
    let build_id = build_id(&fs::read(&so)?)?.ok_or_else(|| {
        format_err!("{member} has no GNU build-id: a crash report could not find its debug file")
    })?;

    cmd!(sh, "objcopy --only-keep-debug {so} {debug}")
        .quiet()
        .run()
        .context("cannot write the debug file (objcopy --only-keep-debug; install binutils)")?;
    // --add-gnu-debuglink records the base name of the path it is given: the asset's name.
    let in_out = sh.push_dir(out);
    cmd!(
        sh,
        "objcopy --strip-unneeded --add-gnu-debuglink={debug_file} {so}"
    )
    .quiet()
    .run()
    .context("cannot strip the extension module (objcopy --strip-unneeded)")?;
    drop(in_out);
    let so_size_after = fs::metadata(&so)?.len();

    cmd!(
        sh,
        "{python} -I -c {WHEEL_SO} replace {wheel} {member} {so}"
    )
    .quiet()
    .run()
    .context("cannot put the stripped extension module back into the wheel")?;
    let wheel_size_after = fs::metadata(wheel)?.len();
    fs::remove_dir_all(work)?;

    let stripped = Stripped {
        member: member.clone(),
        debug_file,
        build_id,
        wheel_size_before,
        wheel_size_after,
        so_size_before,
        so_size_after,
        debug,
    };
    Ok(stripped)
}

/// What must hold of a stripped `.so` and its debug file: no DWARF left in the `.so`, its
/// `.gnu_debuglink` names `debug_name` with the debug file's CRC-32, and both carry one build-id.
pub fn check_pair(so: &[u8], debug: &[u8], debug_name: &str) -> anyhow::Result<String> {
    let elf = goblin::elf::Elf::parse(so).map_err(|e| format_err!("not an ELF file: {e}"))?;
    let dwarf: Vec<&str> = section_names(&elf)
        .filter(|n| n.starts_with(".debug_"))
        .collect();
    if !dwarf.is_empty() {
        bail!("the stripped extension still has debug sections: {dwarf:?}");
    }
    let (name, crc) =
        debuglink(so)?.ok_or_else(|| format_err!("the extension has no .gnu_debuglink"))?;
    if name != debug_name {
        bail!("the extension's .gnu_debuglink names {name}, the asset is {debug_name}");
    }
    let want = crc32(debug);
    if crc != want {
        bail!("the extension's .gnu_debuglink CRC is {crc:08x}, {debug_name}'s is {want:08x}");
    }
    let ids = (build_id(so)?, build_id(debug)?);
    match ids {
        (Some(a), Some(b)) if a == b => Ok(a),
        (a, b) => bail!("build-ids differ: the extension has {a:?}, {debug_name} has {b:?}"),
    }
}

fn section_names<'a>(elf: &'a goblin::elf::Elf<'a>) -> impl Iterator<Item = &'a str> {
    elf.section_headers
        .iter()
        .filter_map(|s| elf.shdr_strtab.get_at(s.sh_name))
}

/// The bytes of the named section, if the file has it with contents.
fn section<'a>(bytes: &'a [u8], name: &str) -> anyhow::Result<Option<&'a [u8]>> {
    let elf = goblin::elf::Elf::parse(bytes).map_err(|e| format_err!("not an ELF file: {e}"))?;
    for s in &elf.section_headers {
        if elf.shdr_strtab.get_at(s.sh_name) != Some(name) {
            continue;
        }
        if s.sh_type == goblin::elf::section_header::SHT_NOBITS {
            return Ok(None);
        }
        let start = usize::try_from(s.sh_offset)?;
        let end = start + usize::try_from(s.sh_size)?;
        return bytes
            .get(start..end)
            .map(Some)
            .ok_or_else(|| format_err!("section {name} lies outside the file"));
    }
    Ok(None)
}

/// The GNU build-id (`NT_GNU_BUILD_ID` in `.note.gnu.build-id`), hex.
pub fn build_id(bytes: &[u8]) -> anyhow::Result<Option<String>> {
    let Some(note) = section(bytes, ".note.gnu.build-id")? else {
        return Ok(None);
    };
    let word = |at: usize| -> Option<usize> {
        let b: [u8; 4] = note.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(b) as usize)
    };
    let (Some(namesz), Some(descsz), Some(kind)) = (word(0), word(4), word(8)) else {
        bail!(".note.gnu.build-id is truncated");
    };
    let desc_at = 12 + namesz.div_ceil(4) * 4;
    let (Some(b"GNU\0"), 3, Some(desc)) = (
        note.get(12..12 + namesz),
        kind,
        note.get(desc_at..desc_at + descsz),
    ) else {
        bail!(".note.gnu.build-id is not a GNU build-id note");
    };
    Ok(Some(desc.iter().map(|b| format!("{b:02x}")).collect()))
}

/// `.gnu_debuglink`: the debug file's name and its CRC-32.
pub fn debuglink(bytes: &[u8]) -> anyhow::Result<Option<(String, u32)>> {
    let Some(link) = section(bytes, ".gnu_debuglink")? else {
        return Ok(None);
    };
    let nul = link
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| format_err!(".gnu_debuglink has no file name"))?;
    let name = std::str::from_utf8(&link[..nul])?.to_owned();
    let crc_at = (nul + 1).div_ceil(4) * 4;
    let crc: [u8; 4] = link
        .get(crc_at..crc_at + 4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format_err!(".gnu_debuglink has no CRC"))?;
    Ok(Some((name, u32::from_le_bytes(crc))))
}

/// The CRC-32 of `.gnu_debuglink` (IEEE 802.3, reflected, as zlib's `crc32`).
pub fn crc32(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|mut c| {
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            c
        })
        .collect();
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// The stripped `.so` inside `wheel`, read back (for checks and tests).
pub fn read_member(
    sh: &Shell,
    python: &Path,
    wheel: &Path,
    work: &Path,
) -> anyhow::Result<Vec<u8>> {
    if work.exists() {
        fs::remove_dir_all(work)?;
    }
    fs::create_dir_all(work)?;
    let listed = cmd!(sh, "{python} -I -c {WHEEL_SO} extract {wheel} {work}")
        .quiet()
        .read()?;
    let members: Vec<String> = serde_json::from_str(&listed)?;
    let [member] = &members[..] else {
        bail!(
            "expected one extension module in {}, found {members:?}",
            wheel.display()
        );
    };
    let bytes = fs::read(work.join(member))?;
    fs::remove_dir_all(work)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    /// A tiny shared object with DWARF and a build-id, packed as a wheel with a RECORD.
    fn standin_wheel(dir: &Path) -> PathBuf {
        let c = dir.join("m.c");
        fs::write(
            &c,
            "int answer(void) { return 42; }\nstatic int s = 1;\nint *p = &s;\n",
        )
        .unwrap();
        let so = dir.join("_m.abi3.so");
        let ok = std::process::Command::new("cc")
            .args(["-g", "-O1", "-shared", "-fPIC", "-Wl,--build-id=sha1", "-o"])
            .arg(&so)
            .arg(&c)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cc");
        let wheel = dir.join("pkg-1.0-cp39-abi3-linux_x86_64.whl");
        let script = r#"
import base64, hashlib, sys, zipfile
so = open(sys.argv[2], "rb").read()
h = base64.urlsafe_b64encode(hashlib.sha256(so).digest()).rstrip(b"=").decode()
init = b"from ._m import *\n"
hi = base64.urlsafe_b64encode(hashlib.sha256(init).digest()).rstrip(b"=").decode()
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for name, body in [("pkg/__init__.py", init), ("pkg/_m.abi3.so", so),
                       ("pkg-1.0.dist-info/RECORD",
                        f"pkg/__init__.py,sha256={hi},{len(init)}\npkg/_m.abi3.so,sha256={h},{len(so)}\npkg-1.0.dist-info/RECORD,,\n".encode())]:
        i = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
        i.compress_type = zipfile.ZIP_DEFLATED
        i.external_attr = 0o100755 << 16
        z.writestr(i, body)
"#;
        let ok = std::process::Command::new("python3")
            .args(["-I", "-c", script])
            .arg(&wheel)
            .arg(&so)
            .status()
            .unwrap()
            .success();
        assert!(ok, "python3");
        wheel
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-strip-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_wheel_ships_a_stripped_so_linked_to_its_debug_file_by_name_crc_and_build_id() {
        let dir = temp("pair");
        let wheel = standin_wheel(&dir);
        let again = dir.join("again");
        fs::create_dir_all(&again).unwrap();
        let wheel2 = again.join(wheel.file_name().unwrap());
        fs::copy(&wheel, &wheel2).unwrap();
        let sh = Shell::new().unwrap();
        let python = Path::new("python3");
        let before = read_member(&sh, python, &wheel, &dir.join("r")).unwrap();
        assert!(section(&before, ".debug_info").unwrap().is_some());
        let want_id = build_id(&before).unwrap().unwrap();

        let out = dir.join("out");
        fs::create_dir_all(&out).unwrap();
        let s = strip_wheel(&sh, python, &wheel, &out, &dir.join("w")).unwrap();
        assert_eq!(s.debug_file, "pkg-1.0-cp39-abi3-linux_x86_64.debug");
        assert_eq!(s.debug, out.join(&s.debug_file));
        assert_eq!(s.build_id, want_id);
        assert!(s.so_size_after < s.so_size_before);

        let so = read_member(&sh, python, &wheel, &dir.join("r")).unwrap();
        let debug = fs::read(&s.debug).unwrap();
        assert!(section(&so, ".debug_info").unwrap().is_none());
        assert!(section(&debug, ".debug_info").unwrap().is_some());
        let (name, crc) = debuglink(&so).unwrap().unwrap();
        assert_eq!(name, s.debug_file);
        assert_eq!(crc, crc32(&debug));
        assert_eq!(build_id(&debug).unwrap().unwrap(), want_id);
        assert_eq!(check_pair(&so, &debug, &s.debug_file).unwrap(), want_id);
        assert!(check_pair(&so, &debug, "other.debug").is_err());
        assert!(check_pair(&before, &debug, &s.debug_file).is_err());

        // The RECORD names the new bytes, and the same input gives the same wheel and debug file.
        let record_ok = std::process::Command::new("python3")
            .args([
                "-I",
                "-c",
                r#"
import base64, hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
rec = z.read("pkg-1.0.dist-info/RECORD").decode()
for line in rec.splitlines():
    name, h, size = line.rsplit(",", 2)
    if h:
        body = z.read(name)
        assert h == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode(), name
        assert int(size) == len(body), name
"#,
            ])
            .arg(&wheel)
            .status()
            .unwrap()
            .success();
        assert!(record_ok, "RECORD");
        let first = (fs::read(&wheel).unwrap(), debug);
        let s2 = strip_wheel(&sh, python, &wheel2, &again, &again.join("w")).unwrap();
        assert_eq!(fs::read(&wheel2).unwrap(), first.0);
        assert_eq!(fs::read(&s2.debug).unwrap(), first.1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
