//! The `rustle` command as a user meets it: a good run, and bad input answered with one
//! clear line and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// The binary cargo built, or `$RUSTLE_BIN` when the tests run from a copy elsewhere (the
/// GPU machine runs the same test executables without cargo).
fn rustle(args: &[&str]) -> Out {
    let bin = std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
    let out = Command::new(bin).args(args).output().unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A failed run: non-zero exit, exactly one error line holding `needle`, no panic.
fn fails_with(args: &[&str], needle: &str) {
    let out = rustle(args);
    assert!(!out.ok, "{args:?} succeeded:\n{}", out.stderr);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("rustle: error:"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "{args:?}: want one error line, stderr:\n{}",
        out.stderr
    );
    assert!(
        errors[0].contains(needle),
        "{args:?}: {:?} lacks {needle:?}",
        errors[0]
    );
    for bad in ["panicked", "backtrace", "internal error"] {
        assert!(
            !out.stderr.contains(bad),
            "{args:?}: {bad} in stderr:\n{}",
            out.stderr
        );
    }
}

/// A scratch copy of a tiny model folder, to be broken on purpose.
fn tiny_copy(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rustle-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir("tests/golden/tiny-llama3").unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, from: &str, to: &str) {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains(from), "config.json lacks {from:?}");
    std::fs::write(&p, text.replace(from, to)).unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn default_model_says_paris() {
    let out = rustle(&[
        "-p",
        "The capital of France is",
        "-n",
        "16",
        "--device",
        "cpu",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("Paris"), "{:?}", out.stdout);
    let summary = out.stderr.lines().last().unwrap();
    assert!(
        summary.contains("5 prompt tokens, 16 generated") && summary.contains("tok/s"),
        "{summary}"
    );
}

#[test]
fn chat_mode_answers() {
    let out = rustle(&[
        "--chat",
        "-p",
        "What is the capital of France?",
        "-n",
        "24",
        "--device",
        "cpu",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("Paris"), "{:?}", out.stdout);
}

#[test]
fn a_seeded_sampled_run_repeats() {
    let tiny = "tests/golden/tiny-llama3";
    let args = [
        "-m",
        tiny,
        "-p",
        "Hello",
        "-n",
        "24",
        "--temperature",
        "1.0",
        "--top-p",
        "0.95",
        "--seed",
        "5",
    ];
    let (a, b) = (rustle(&args), rustle(&args));
    assert!(a.ok && b.ok, "{}", a.stderr);
    assert_eq!(a.stdout, b.stdout);
    let other = rustle(&[
        "-m",
        tiny,
        "-p",
        "Hello",
        "-n",
        "24",
        "--temperature",
        "1.0",
        "--seed",
        "6",
    ]);
    assert_ne!(a.stdout, other.stdout);
}

#[test]
fn missing_paths() {
    fails_with(&["-m", "/no/such/model", "-p", "hi"], "/no/such/model");
    fails_with(
        &[
            "-f",
            "/no/such/prompt.txt",
            "-m",
            "tests/golden/tiny-llama3",
        ],
        "/no/such/prompt.txt",
    );
    let empty = std::env::temp_dir().join(format!("rustle-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    fails_with(&["-m", s(&empty), "-p", "hi"], "config.json");
}

#[test]
fn corrupt_model_files() {
    let dir = std::env::temp_dir().join(format!("rustle-cli-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a model at all").unwrap();
    fails_with(&["-m", s(&junk), "-p", "hi"], "not a valid GGUF file");
    // The default model's first kilobyte: a real header, cut short.
    let model = rustle::loader::resolve_model_path(None).unwrap();
    let head = &std::fs::read(&model).unwrap()[..1024];
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, head).unwrap();
    fails_with(&["-m", s(&cut), "-p", "hi"], "truncated");

    let st = tiny_copy("st");
    let p = st.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&["-m", s(&st), "-p", "hi"], "not a valid safetensors file");
    std::fs::write(&p, [0xff; 8]).unwrap();
    fails_with(&["-m", s(&st), "-p", "hi"], "not a valid safetensors file");
}

#[test]
fn config_problems() {
    let shape = tiny_copy("shape");
    edit_config(
        &shape,
        "\"intermediate_size\": 96",
        "\"intermediate_size\": 128",
    );
    fails_with(&["-m", s(&shape), "-p", "hi"], "want [128, 64]");
    fails_with(&["-m", s(&shape), "-p", "hi"], "found [96, 64] bf16");

    let missing = tiny_copy("missing");
    edit_config(&missing, "\"hidden_size\": 64,", "");
    fails_with(
        &["-m", s(&missing), "-p", "hi"],
        "missing field `hidden_size`",
    );

    let arch = tiny_copy("arch");
    edit_config(&arch, "LlamaForCausalLM", "GPT2LMHeadModel");
    fails_with(
        &["-m", s(&arch), "-p", "hi"],
        "unsupported architecture \"GPT2LMHeadModel\"",
    );
}

#[test]
fn prompt_problems() {
    let tiny = "tests/golden/tiny-llama3";
    let long = "word ".repeat(100); // ~500 tokens, the tiny model's context is 256
    fails_with(
        &["-m", tiny, "-p", &long],
        "but the model's context holds only 256",
    );
    fails_with(
        &[
            "-m",
            tiny,
            "-p",
            "a prompt of some forty bytes, quite long",
            "--kv-blocks",
            "1",
        ],
        "KV cache (--kv-blocks) holds only 16",
    );
    let dir = std::env::temp_dir().join(format!("rustle-cli-prompt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").unwrap();
    fails_with(&["-m", tiny, "-f", s(&latin1)], "not UTF-8");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    fails_with(&["-m", tiny, "-f", s(&empty)], "prompt is empty");
}

#[test]
fn bad_flags() {
    let tiny = "tests/golden/tiny-llama3";
    fails_with(&["-m", tiny, "-p", "hi", "--top-p", "0"], "--top-p");
    fails_with(
        &["-m", tiny, "-p", "hi", "--temperature=-1"],
        "--temperature",
    );
    fails_with(&["-m", tiny, "-p", "hi", "--kv-blocks", "0"], "--kv-blocks");
    // A pool no host can hold: one line, not an allocation abort.
    let huge = [
        "-m",
        tiny,
        "-p",
        "hi",
        "--device",
        "cpu",
        "--kv-blocks",
        "100000000000",
    ];
    fails_with(&huge, "lower --kv-blocks");
    // Without a GPU, asking for one is one clear line; with one, it runs.
    match rustle::gpu::Gpu::new() {
        Err(_) => fails_with(&["-m", tiny, "-p", "hi", "--device", "gpu"], "GPU: "),
        Ok(_) => {
            assert!(rustle(&["-m", tiny, "-p", "hi", "-n", "4", "--device", "gpu"]).ok);
            // A KV pool far past the device's memory.
            let huge = [
                "-m",
                tiny,
                "-p",
                "hi",
                "--device",
                "gpu",
                "--kv-blocks",
                "1000000000",
            ];
            fails_with(&huge, "GPU out of memory allocating the KV cache");
        }
    }
    // clap's own usage errors: non-zero, no panic.
    let out = rustle(&["-m", tiny]);
    assert!(!out.ok && out.stderr.contains("--prompt"), "{}", out.stderr);
}

#[test]
fn help_explains() {
    let out = rustle(&["--help"]);
    assert!(out.ok);
    for flag in [
        "--prompt",
        "--prompt-file",
        "--max-tokens",
        "--model",
        "--device",
        "--chat",
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--seed",
        "--kv-blocks",
        "SmolLM2",
    ] {
        assert!(out.stdout.contains(flag), "--help lacks {flag}");
    }
}
