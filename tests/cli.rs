//! The `rustle` command as a user meets it: a good run, and bad input answered with one
//! clear line and a non-zero exit, never a panic. The failures a mutation campaign found
//! (issue 10) each have a test here that ends in its exact error line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::tiny::{self, Meta};

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// The binary cargo built, or `$RUSTLE_BIN` when the tests run from a copy elsewhere (the
/// GPU machine runs the same test executables without cargo).
fn rustle(args: &[&str]) -> Out {
    rustle_with(args, &[])
}

/// `rustle` with these environment variables set.
fn rustle_with(args: &[&str], vars: &[(&str, &str)]) -> Out {
    let bin = std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
    let out = Command::new(bin)
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .unwrap();
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

/// A failed run whose one error line is exactly `line`.
fn fails_with_line(args: &[&str], line: &str) {
    fails_with(args, line);
    let out = rustle(args);
    let got = out
        .stderr
        .lines()
        .find(|l| l.starts_with("rustle: error:"))
        .unwrap();
    assert_eq!(got, line, "{args:?}");
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

/// Perplexity of the default model on a checked-in public-domain text: a number a reader can
/// compare with llama-perplexity's, on every chunk's second half, and the same number each
/// run (greedy scoring has no randomness). Its device is the CPU so that the figure is the
/// same on every machine that runs the suite.
#[test]
fn perplexity_of_a_text() {
    let args = [
        "perplexity",
        "-f",
        "tests/data/declaration.txt",
        "--ctx",
        "64",
        "--device",
        "cpu",
        "--json",
    ];
    let out = rustle(&args);
    assert!(out.ok, "{}", out.stderr);
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let chunks = r["chunks"].as_u64().unwrap();
    // The second half of each chunk of 64 but its last token, which predicts nothing here.
    assert_eq!(r["scored_tokens"].as_u64().unwrap(), chunks * 31);
    assert!(chunks >= 5, "the text is several chunks: {r}");
    let ppl = r["perplexity"].as_f64().unwrap();
    // A known text, a small model: far better than chance (49152 tokens), far from certain.
    assert!(ppl > 1.5 && ppl < 100.0, "{r}");
    assert!((r["mean_nll"].as_f64().unwrap().exp() - ppl).abs() < 1e-9 * ppl);
    assert_eq!(rustle(&args).stdout, out.stdout, "the same figure each run");
    assert!(
        out.stderr.contains(&format!("chunk {chunks}/{chunks}")),
        "progress per chunk"
    );
    // Too short a text for one chunk, and no text at all, are one line each.
    fails_with(
        &[
            "perplexity",
            "-f",
            "tests/data/declaration.txt",
            "--ctx",
            "4096",
            "--device",
            "cpu",
        ],
        "shorter than one chunk of --ctx 4096",
    );
    fails_with(
        &["perplexity", "-f", "no/such/file.txt"],
        "no/such/file.txt",
    );
}

/// A run saved with --save-logits, then the same run against it: no divergence (but the f16
/// rounding of the saved log-probabilities) and the same most likely token everywhere; a
/// saved run of another --ctx, or a file that is not one, refused by name.
#[test]
fn kl_divergence_against_a_saved_run() {
    let saved = std::env::temp_dir().join(format!("rustle-kl-{}.bin", std::process::id()));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "-f",
            "tests/data/declaration.txt",
            "--device",
            "cpu",
        ];
        args.extend_from_slice(extra);
        rustle(&args)
    };
    let first = run(&["--ctx", "64", "--save-logits", s(&saved)]);
    assert!(first.ok, "{}", first.stderr);
    let out = run(&["--ctx", "64", "--json", "--kl-divergence", s(&saved)]);
    assert!(out.ok, "{}", out.stderr);
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let kl = r["kl_divergence"].as_f64().unwrap();
    assert!((0.0..1e-3).contains(&kl.abs()), "{r}");
    // The same run against itself: each token's divergence is ~0, so its 99th percentile is
    // too, and at least the mean.
    let p99 = r["kl_divergence_p99"].as_f64().unwrap();
    assert!(p99.abs() < 1e-3 && p99 >= kl - 1e-12, "{r}");
    assert_eq!(r["top_token_agreement"].as_f64(), Some(1.0), "{r}");
    let other = run(&["--ctx", "32", "--kl-divergence", s(&saved)]);
    assert!(
        !other.ok && other.stderr.contains("saved from another run"),
        "{}",
        other.stderr
    );
    let not_one = run(&[
        "--ctx",
        "64",
        "--kl-divergence",
        "tests/data/declaration.txt",
    ]);
    assert!(
        !not_one.ok && not_one.stderr.contains("not a file of"),
        "{}",
        not_one.stderr
    );
    std::fs::remove_file(&saved).unwrap();
}

/// `rustle chat` fed from a pipe: two turns, the second with the first in its context (its
/// token count includes it), commands answered (the first question asked so that the small
/// model's answer holds on every CPU path, as in `chat_mode_answers`), and a conversation
/// that outgrows a small context (tiny-qwen3's 256 tokens) refused in one line while the
/// program goes on.
#[test]
fn chat_holds_a_conversation() {
    let chat = |args: &[&str], input: &str| {
        let bin =
            std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
        let mut child = Command::new(bin)
            .arg("chat")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let out = chat(
        &["--device", "cpu", "-n", "16"],
        "Tell me the capital of France.\n/bogus\nAnd of Italy?\n/exit\n",
    );
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("Paris"), "{}", out.stdout);
    assert!(
        out.stderr.contains("/bogus is no command"),
        "{}",
        out.stderr
    );
    // Each turn's line: "[USED of CONTEXT tokens, ...]"; the second holds the first.
    let used: Vec<usize> = out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(used.len(), 2, "{}", out.stderr);
    assert!(used[1] > used[0] + 10, "{used:?}");

    let long = "a".repeat(400);
    let out = chat(
        &[
            "-m",
            "tests/golden/tiny-qwen3",
            "--device",
            "cpu",
            "-n",
            "4",
        ],
        &format!("{long}\nhi\n"),
    );
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("more than the context of 256; /reset"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(" of 256 tokens"),
        "the next line still answered: {}",
        out.stderr
    );
}

/// The question asks for one word: asked plainly, this small model's greedy answer sits
/// at a near-tie that the CPU's kernels decide (" Paris" on the AVX-512 VNNI machines this
/// test passed on before, "L'Étoile, la Marseillaise, ..." with AVX2 or portable Rust, on
/// the same weights); asked this way AVX2 and portable Rust both answer "The capital of
/// France is Paris." The server's tests ask it the same way.
#[test]
fn chat_mode_answers() {
    let out = rustle(&[
        "--chat",
        "-p",
        "What is the capital of France? Answer in one word.",
        "-n",
        "24",
        "--device",
        "cpu",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("Paris"), "{:?}", out.stdout);
}

/// `--json-schema`, `--json` and `--regex` hold the default model's output to the grammar,
/// sampled or greedy; a bad grammar is one error line.
#[test]
fn structured_output_flags() {
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}"#;
    for temperature in ["0", "1.0"] {
        let out = rustle(&[
            "--chat",
            "-p",
            "Invent a person.",
            "--json-schema",
            schema,
            "-n",
            "100",
            "--temperature",
            temperature,
            "--seed",
            "5",
            "--device",
            "cpu",
        ]);
        assert!(out.ok, "{}", out.stderr);
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("{:?}: {e}", out.stdout));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 2, "{v}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 20, "{v}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{v}");
    }
    let out = rustle(&[
        "--chat",
        "-p",
        "A colour?",
        "--json",
        "-n",
        "100",
        "--device",
        "cpu",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(v.is_object(), "{v}");
    let out = rustle(&[
        "--chat",
        "-p",
        "Is Paris in France?",
        "--regex",
        "(Yes|No)[.!]",
        "-n",
        "20",
        "--device",
        "cpu",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let answer = out.stdout.trim();
    assert!(
        ["Yes.", "Yes!", "No.", "No!"].contains(&answer),
        "{answer:?}"
    );

    fails_with(
        &["-p", "x", "--json-schema", "{not json"],
        "--json-schema: not JSON",
    );
    fails_with(
        &["-p", "x", "--grammar", "/no/such.lark"],
        "--grammar /no/such.lark",
    );
    fails_with(
        &["-p", "x", "--grammar", "/dev/null", "--device", "cpu"],
        "the grammar: ",
    );
    let out = rustle(&["-p", "x", "--json", "--regex", "a"]);
    assert!(
        !out.ok && out.stderr.contains("cannot be used with"),
        "{}",
        out.stderr
    );
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

/// The fp8 KV cache is the GPU's: on the CPU, `rustle`, `rustle perplexity` and `rustle
/// serve` refuse it in one line that says why, before any work.
#[test]
fn kv_dtype_fp8_on_the_cpu_is_refused() {
    let tiny = "tests/golden/tiny-llama3";
    let why = "--kv-dtype fp8 is the GPU's cache";
    fails_with(
        &[
            "-m",
            tiny,
            "-p",
            "hi",
            "--device",
            "cpu",
            "--kv-dtype",
            "fp8",
        ],
        why,
    );
    let text = "tests/data/declaration.txt";
    let ppl = [
        "perplexity",
        "-m",
        tiny,
        "-f",
        text,
        "--ctx",
        "16",
        "--device",
        "cpu",
    ];
    fails_with(&[&ppl[..], &["--kv-dtype", "fp8"]].concat(), why);
    let serve = ["serve", "--port", "0", "-m", tiny, "--device", "cpu"];
    fails_with(&[&serve[..], &["--kv-dtype", "fp8"]].concat(), why);
    fails_with(&["-m", tiny, "-p", "hi", "--kv-dtype", "fp9"], "bf16, fp8");
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

/// `MemTotal` from `/proc/meminfo`, in GiB.
fn host_memory_gib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1u64 << 20) as f64)
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
    // A pool past the host's memory (2^24 blocks of 4 KiB in the fast backend's bf16 cache,
    // 64 GiB, more than the CI machine holds; the GPU machine's 125 GiB would take it): one
    // line, not an allocation abort or a pool that fails under load.
    let huge = [
        "-m",
        tiny,
        "-p",
        "hi",
        "--device",
        "cpu",
        "--kv-blocks",
        "16777216",
    ];
    match host_memory_gib() {
        Some(gib) if gib < 64.0 => fails_with(&huge, "lower --kv-blocks"),
        other => eprintln!("skipped the 64 GiB pool: host memory {other:?} GiB"),
    }
    // Without a GPU, asking for one is one clear line; with one, it runs.
    match rustle::gpu::Gpu::new() {
        Err(_) => fails_with(&["-m", tiny, "-p", "hi", "--device", "gpu"], "GPU: "),
        Ok(_) => {
            assert!(rustle(&["-m", tiny, "-p", "hi", "-n", "4", "--device", "gpu"]).ok);
            // A KV pool far past the device's memory (the default model's blocks are
            // 720 KiB).
            let huge = ["-p", "hi", "--device", "gpu", "--kv-blocks", "16777216"];
            fails_with(&huge, "GPU out of memory allocating the KV cache");
        }
    }
    // `--weights` other than `stored` on the CPU: said before the weights are read, by
    // `rustle` and by `rustle serve` (which neither loads the model nor listens).
    for weights in ["bf16", "fp8"] {
        let line = format!(
            "rustle: error: --weights {weights} is for the GPU; the CPU holds the weights as the files store them"
        );
        let on_cpu = ["-m", tiny, "--device", "cpu", "--weights", weights];
        let run = [&["-p", "hi"][..], &on_cpu].concat();
        fails_with_line(&run, &line);
        let out = rustle(&run);
        assert!(!out.stderr.contains("loaded"), "{run:?}:\n{}", out.stderr);
        fails_with_line(&[&["serve", "--port", "0"][..], &on_cpu].concat(), &line);
    }
    // clap's own usage errors, in rustle's one-line form.
    fails_with_line(
        &["-m", tiny],
        "rustle: error: the following required arguments were not provided: --prompt <PROMPT>",
    );
}

/// An environment knob's bad value is one line naming it, its value and what it wants, and a
/// non-zero exit, before any command starts: before a model is read or a GPU asked for, so
/// on a machine without one too (once such values were the default, in silence).
#[test]
fn a_bad_knob_is_one_line() {
    let tiny = "tests/golden/tiny-llama3";
    let cases = [
        (
            ("RUSTLE_GEMV_TOKENS", "abc"),
            "want a whole number from 1 to 8",
        ),
        (
            ("RUSTLE_GEMV_TOKENS", "9"),
            "want a whole number from 1 to 8",
        ),
        (("RUSTLE_PDL", "off"), "want 0 (off) or 1 (on)"),
        (("RUSTLE_CPU_PORTABLE", "yes"), "want 0 (off) or 1 (on)"),
        (
            ("RUSTLE_STREAM_BYTES", "50K"),
            "want a whole number from 1 to 232320",
        ),
    ];
    let commands: [&[&str]; 4] = [
        &["-m", tiny, "-p", "hi", "--device", "cpu"],
        &["bench"],
        &["profile", "--device", "cpu-reference", "-m", tiny],
        &["serve", "--port", "0", "-m", tiny, "--device", "cpu"],
    ];
    for ((name, value), want) in cases {
        for args in commands {
            let out = rustle_with(args, &[(name, value)]);
            assert!(!out.ok, "{name}={value} {args:?} succeeded");
            assert_eq!(
                out.stderr.trim_end(),
                format!("rustle: error: {name}={value}: {want}"),
                "{name}={value} {args:?}"
            );
            assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        }
    }
    // Empty is unset: the run goes on.
    let out = rustle_with(
        &["-m", tiny, "-p", "hi", "-n", "2", "--device", "cpu"],
        &[("RUSTLE_GEMV_TOKENS", ""), ("RUSTLE_PDL", "")],
    );
    assert!(out.ok, "{}", out.stderr);
}

/// `bench --boundaries` is a measurement experiment: a default build leaves it out of
/// `--help` and refuses it with one line that says how to build it.
#[cfg(not(feature = "probes"))]
#[test]
fn boundaries_needs_the_probes_feature() {
    fails_with_line(
        &["bench", "--boundaries"],
        "rustle: error: bench --boundaries is a measurement experiment, built only with \
         `cargo build --release --features probes`",
    );
    let help = rustle(&["bench", "--help"]);
    assert!(
        help.ok && !help.stdout.contains("--boundaries"),
        "{}",
        help.stdout
    );
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

// ---------------------------------------------------------------------------------------
// Issue 10: the mutation campaign's failures, each ending in its one line.

/// A scratch folder holding `file` (the tiny GGUF model with a change), its path.
fn tiny_gguf(tag: &str, edit: impl FnOnce(&mut tiny::Gguf)) -> PathBuf {
    let mut g = if tag.contains("spm") {
        tiny::gguf_spm()
    } else {
        tiny::gguf_bpe()
    };
    edit(&mut g);
    let path = tiny::scratch_dir(&format!("cli-gguf-{tag}")).join("model.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    path
}

fn not_valid_gguf(path: &Path, reason: &str) -> String {
    format!(
        "rustle: error: {}: not a valid GGUF file: {reason}",
        path.display()
    )
}

#[test]
fn config_head_dim_that_overflows_is_refused() {
    // Was: `capacity overflow` (a panic).
    let d = tiny_copy("hd-overflow");
    edit_config(&d, "\"head_dim\": 16", "\"head_dim\": 9223372036854775824");
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        "rustle: error: config: `head_dim` is 9223372036854775824, more than rustle's limit of 1024",
    );
}

#[test]
fn config_head_count_that_wraps_is_refused() {
    // Was: 2^63 + 4 heads of 16 wrap to 64, pass the shape checks, and panic on a slice
    // index in cpu/ops.rs.
    let d = tiny_copy("heads-wrap");
    edit_config(
        &d,
        "\"num_attention_heads\": 4",
        "\"num_attention_heads\": 9223372036854775812",
    );
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        "rustle: error: config: `num_attention_heads` is 9223372036854775812, more than rustle's limit of 1024",
    );
}

#[test]
fn config_head_counts_of_2_pow_32_with_empty_projections_are_refused() {
    // Was: heads = kv heads = head_dim = 2^32 make q_dim and kv_dim 0, which zero-size
    // q/k/v/o tensors match; a divide by zero in runner.rs followed.
    let d = tiny::scratch_dir("cli-heads-2-32");
    tiny::write_hf_folder(&d);
    let shards = tiny::hf_shards().map(|shard| {
        shard
            .into_iter()
            .map(|mut t| {
                if t.name.contains("self_attn") {
                    t.shape[0] = 0;
                    t.data.clear();
                }
                t
            })
            .collect::<Vec<_>>()
    });
    for (shard, name) in shards.iter().zip(tiny::SHARDS) {
        let header = tiny::st_header(shard).to_string();
        std::fs::write(d.join(name), tiny::st_file(&header, shard)).unwrap();
    }
    let mut cfg = tiny::hf_config();
    for f in ["num_attention_heads", "num_key_value_heads", "head_dim"] {
        cfg[f] = serde_json::json!(1u64 << 32);
    }
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        "rustle: error: config: `num_attention_heads` is 4294967296, more than rustle's limit of 1024",
    );
}

#[test]
fn gguf_key_length_that_overflows_is_refused() {
    // Was: a slice index panic in model.rs.
    let p = tiny_gguf("keylen", |g| {
        g.set("llama.attention.key_length", Meta::U64((1 << 63) + 16));
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        "rustle: error: config: `llama.attention.key_length` is 9223372036854775824, more than rustle's limit of 1024",
    );
}

#[test]
fn gguf_head_count_that_wraps_is_refused() {
    // Was: a slice index panic in model.rs.
    let p = tiny_gguf("headcount", |g| {
        g.set("llama.attention.head_count", Meta::U64((1 << 63) + 4));
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        "rustle: error: config: `llama.attention.head_count` is 9223372036854775812, more than rustle's limit of 1024",
    );
}

#[test]
fn gguf_head_counts_of_2_pow_32_are_refused() {
    // Was: a divide by zero in model.rs.
    let p = tiny_gguf("heads-2-32", |g| {
        for k in ["head_count", "head_count_kv", "key_length", "value_length"] {
            g.set(&format!("llama.attention.{k}"), Meta::U64(1 << 32));
        }
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        "rustle: error: config: `llama.attention.head_count` is 4294967296, more than rustle's limit of 1024",
    );
}

#[test]
fn gguf_token_types_shorter_than_tokens_are_refused() {
    // Was: index out of bounds in tokenizer.rs (a SentencePiece vocabulary).
    let p = tiny_gguf("spm-types", |g| {
        let Some(Meta::Array(ty, items)) = g.get("tokenizer.ggml.token_type").cloned() else {
            unreachable!()
        };
        g.set(
            "tokenizer.ggml.token_type",
            Meta::Array(ty, items[..100].to_vec()),
        );
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        "rustle: error: tokenizer: GGUF `tokenizer.ggml.token_type` has 100 entries for 269 tokens",
    );
}

#[test]
fn tokenizer_json_cut_in_its_decoder_is_refused() {
    // Was: `.expect("Helper")` panicking inside the tokenizers crate.
    let d = tiny_copy("tok-cut");
    let p = d.join("tokenizer.json");
    let text = std::fs::read_to_string(&p).unwrap();
    // Just after the first entry of the decoder object.
    let decoder = text.find("\"decoder\"").unwrap();
    let at = decoder + text[decoder..].find(',').unwrap() + 1;
    std::fs::write(&p, &text[..at]).unwrap();
    let line = text[..at].lines().count();
    let column = text[..at].lines().last().unwrap().len();
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        &format!(
            "rustle: error: tokenizer: {}: not valid JSON: EOF while parsing an object at line {line} column {column}",
            p.display()
        ),
    );
}

#[test]
fn tokenizer_replace_with_empty_pattern_is_refused() {
    // Was: index out of bounds inside the tokenizers crate when encoding the prompt; the
    // panic is caught at the crate's boundary and the tokenizer refused as it loads.
    let d = tiny_copy("tok-replace");
    let p = d.join("tokenizer.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replacen(
            "\"normalizer\": null",
            r#""normalizer": {"type": "Replace", "pattern": {"String": ""}, "content": "x"}"#,
            1,
        ),
    )
    .unwrap();
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        &format!(
            "rustle: error: tokenizer: {}: encoding a test text: the tokenizers library failed (index out of bounds: the len is 11 but the index is 11)",
            p.display()
        ),
    );
}

#[test]
fn size_flags_are_bounded_before_loading() {
    // Was: `--prefill-chunk 100000000` aborted allocating 230 GB, 18446744073709551615
    // was a capacity overflow, and 0 failed after the load without naming the flag. The
    // model path does not exist: each flag is refused before anything is opened.
    let m = "/no/such/model";
    // (the flag given, the flag as clap names it: `--prefill-chunk` is `--token-budget`'s
    // older name)
    for (given, flag, value, range) in [
        (
            "--prefill-chunk",
            "--token-budget <N>",
            "100000000",
            "1..=65536",
        ),
        (
            "--prefill-chunk",
            "--token-budget <N>",
            "18446744073709551615",
            "1..=65536",
        ),
        ("--token-budget", "--token-budget <N>", "0", "1..=65536"),
        ("--kv-blocks", "--kv-blocks <N>", "0", "1..=16777216"),
        (
            "--kv-blocks",
            "--kv-blocks <N>",
            "100000000000",
            "1..=16777216",
        ),
        (
            "--max-tokens",
            "--max-tokens <MAX_TOKENS>",
            "0",
            "1..=16777216",
        ),
    ] {
        fails_with_line(
            &["-m", m, "-p", "hi", given, value],
            &format!(
                "rustle: error: invalid value '{value}' for '{flag}': {value} is not in {range}"
            ),
        );
    }
    fails_with_line(
        &[
            "-m",
            m,
            "-p",
            "hi",
            "--prefill-chunk",
            "99999999999999999999",
        ],
        "rustle: error: invalid value '99999999999999999999' for '--token-budget <N>': number too large to fit in target type",
    );
}

#[test]
fn chat_template_of_100_mb_fails_fast() {
    // Was: the 100 MB text tokenized in full (18 GB, 134 s) before the context check.
    let d = tiny_copy("chat-100mb");
    std::fs::write(d.join("chat_template.jinja"), "{{ 'x' * 100000000 }}").unwrap();
    // On the CPU: on a GPU machine the run would first open the GPU (its module compiled
    // for the device, seconds when the driver's cache is cold), which is not what this
    // times.
    let t = Instant::now();
    fails_with_line(
        &["-m", s(&d), "-p", "hi", "--chat", "--device", "cpu"],
        "rustle: error: chat template: the rendered prompt passed 8192 bytes, more than the model's context can hold",
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn prompt_longer_than_the_context_is_refused_before_tokenizing() {
    let dir = tiny::scratch_dir("cli-long-prompt");
    let p = dir.join("long.txt");
    std::fs::write(&p, "a".repeat(30_000_000)).unwrap();
    fails_with_line(
        &["-m", "tests/golden/tiny-llama3", "-f", s(&p)],
        "rustle: error: prompt is 30000000 bytes, more than the model's context of 256 tokens can hold (at most 32 bytes a token)",
    );
}

#[test]
fn context_of_8_million_positions_costs_what_the_run_needs() {
    // Was: the whole KV pool zero-filled and RoPE tables for every position computed
    // (4.7 GB, 9-16 s) on a tiny model claiming 8M positions.
    let d = tiny_copy("ctx-8m");
    edit_config(
        &d,
        "\"max_position_embeddings\": 256",
        "\"max_position_embeddings\": 8388608",
    );
    let gguf = tiny_gguf("ctx-8m-gguf", |g| {
        g.set("llama.context_length", Meta::U32(8_388_608));
    });
    for model in [s(&d), s(&gguf)] {
        let t = Instant::now();
        let out = rustle(&["-m", model, "-p", "hello", "-n", "4", "--device", "cpu"]);
        assert!(out.ok, "{}", out.stderr);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}

#[test]
fn nonsense_norm_eps_and_rope_theta_are_refused() {
    // Was: both ran, exit 0, and printed `!!!!`.
    let eps = tiny_copy("eps");
    edit_config(&eps, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1");
    fails_with_line(
        &["-m", s(&eps), "-p", "hi"],
        "rustle: error: config: `rms_norm_eps` is -1; it must be a small positive number such as 1e-5",
    );
    let theta = tiny_copy("theta");
    edit_config(
        &theta,
        "\"rms_norm_eps\"",
        "\"rope_theta\": 0, \"rms_norm_eps\"",
    );
    fails_with_line(
        &["-m", s(&theta), "-p", "hi"],
        "rustle: error: config: `rope_theta` is 0; it must be a finite number above 1 such as 10000",
    );
    let p = tiny_gguf("theta", |g| {
        g.set("llama.rope.freq_base", Meta::F32(0.0));
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        "rustle: error: config: `llama.rope.freq_base` is 0; it must be a finite number above 1 such as 10000",
    );
}

#[test]
fn gguf_duplicate_names_are_refused() {
    // Were accepted silently (the last one won).
    let p = tiny_gguf("dup-tensor", |g| {
        let t = g.tensors[1].clone();
        g.tensors.push(t);
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        &not_valid_gguf(
            &p,
            "tensor \"blk.0.attn_norm.weight\" appears twice in the tensor table",
        ),
    );
    let p = tiny_gguf("dup-key", |g| {
        g.meta.push(("llama.block_count".into(), Meta::U32(1)));
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        &not_valid_gguf(&p, "metadata key \"llama.block_count\" appears twice"),
    );
}

#[test]
fn gguf_misaligned_or_overlapping_tensors_are_refused() {
    // Were accepted silently.
    let p = tiny_gguf("misaligned", |g| {
        g.tensors[1].offset = Some(1092);
    });
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        &not_valid_gguf(
            &p,
            "tensor \"blk.0.attn_norm.weight\": data offset 1092 is not a multiple of the alignment 32",
        ),
    );
    let p = tiny_gguf("overlap", |g| {
        g.tensors[2].offset = Some(0);
    });
    let (_, _, tensors) = rustle::weights::gguf::parse(&tiny::gguf_bpe().bytes()).unwrap();
    let (at, n) = (tensors[0].offset, tensors[0].n_bytes);
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        &not_valid_gguf(
            &p,
            &format!(
                "tensors \"token_embd.weight\" (bytes {at}..{}) and \"blk.0.attn_q.weight\" (from byte {at}) overlap",
                at + n
            ),
        ),
    );
}

#[test]
fn a_safetensors_file_given_for_its_folder() {
    // Was: "not a valid GGUF file". With config.json beside it, the folder loads.
    let out = rustle(&[
        "-m",
        "tests/golden/tiny-llama3/model.safetensors",
        "-p",
        "hi",
        "-n",
        "2",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stderr.contains("loaded tiny-llama3 (safetensors"));
    let d = tiny::scratch_dir("cli-lone-st");
    let p = d.join("model.safetensors");
    std::fs::copy("tests/golden/tiny-llama3/model.safetensors", &p).unwrap();
    fails_with_line(
        &["-m", s(&p), "-p", "hi"],
        &format!(
            "rustle: error: {}: one file of a Hugging Face model, with no config.json beside it; pass the folder that holds config.json, tokenizer.json and the .safetensors files",
            p.display()
        ),
    );
}

#[test]
fn head_dim_zero_is_named() {
    // Was: "must be even for RoPE".
    let d = tiny_copy("hd-zero");
    edit_config(&d, "\"head_dim\": 16", "\"head_dim\": 0");
    fails_with_line(
        &["-m", s(&d), "-p", "hi"],
        "rustle: error: config: `head_dim` must be positive",
    );
}

#[test]
fn chat_template_jinja_is_read() {
    // transformers 5 saves the template beside the tokenizer as chat_template.jinja; it was
    // ignored for bare ChatML.
    let d = tiny_copy("chat-jinja");
    std::fs::write(
        d.join("chat_template.jinja"),
        "{{ raise_exception('from chat_template.jinja') }}",
    )
    .unwrap();
    fails_with_line(
        &["-m", s(&d), "-p", "hi", "--chat"],
        "rustle: error: chat template: invalid operation: from chat_template.jinja (in chat:1)",
    );
    std::fs::write(
        d.join("chat_template.jinja"),
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let out = rustle(&["-m", s(&d), "-p", "hi", "--chat", "-n", "2"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(!out.stderr.contains("ChatML"), "{}", out.stderr);
    // A model with no template says so, and runs on ChatML.
    let out = rustle(&[
        "-m",
        "tests/golden/tiny-llama3",
        "-p",
        "hi",
        "--chat",
        "-n",
        "2",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "rustle: the model has no chat template (looked for chat_template.jinja, tokenizer_config.json, GGUF metadata); using ChatML"
        ),
        "{}",
        out.stderr
    );
}
