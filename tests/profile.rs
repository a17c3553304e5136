//! `rustle profile --from`: the table and the roofline chart from a saved profile, no GPU.
//! (The counting formulas are unit-tested in `rustle::traffic`.)

use std::process::Command;

fn rustle(args: &[&str]) -> std::process::Output {
    let bin = std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
    Command::new(bin).args(args).output().unwrap()
}

/// Runs `rustle profile <args> --out DIR` into a fresh temporary `DIR` named by `tag`;
/// returns the folder and stdout, after checking the run succeeded.
fn profile_into(tag: &str, args: &[&str]) -> (std::path::PathBuf, String) {
    let out = std::env::temp_dir().join(format!("rustle-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut all = vec!["profile"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let r = rustle(&all);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    (out, String::from_utf8_lossy(&r.stdout).into_owned())
}

#[test]
fn table_and_chart_from_a_saved_profile() {
    let (out, stdout) = profile_into(
        "profile",
        &["--from", "tests/fixtures/profile-example.json"],
    );
    // The fixture's ceilings: 4 TB/s and 800 TFLOP/s, ridge at 200 FLOP/byte.
    assert!(stdout.contains("ridge 200.0 FLOP/byte"), "{stdout}");
    assert!(
        stdout.contains("memory 4.0 TB/s") && stdout.contains("compute 800.0 TFLOP/s"),
        "{stdout}"
    );
    let line = |kernel: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(kernel))
            .unwrap_or_else(|| panic!("{kernel}: {stdout}"))
            .to_string()
    };
    // gemm_bf16: 16 TFLOP in 0.4 s = 40000 GFLOP/s at 400 FLOP/byte: compute-bound, 5% of
    // the roof.
    let gemm = line("gemm_bf16");
    assert!(
        gemm.contains("compute")
            && gemm.contains("40000.0")
            && gemm.contains("400.00")
            && gemm.contains("5.0%"),
        "{gemm}"
    );
    // gemv_bf16: 12 GB in 4 ms = 3000 GB/s at 1 FLOP/byte: memory-bound, 75% of the slope.
    let gemv = line("gemv_bf16");
    assert!(
        gemv.contains("memory") && gemv.contains("3000") && gemv.contains("75.0%"),
        "{gemv}"
    );
    assert!(stdout.matches("total").count() == 2, "{stdout}");
    let svg = std::fs::read_to_string(out.join("roofline.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("gemm_bf16") && svg.contains("gemv_bf16"));
    assert!(svg.contains("prefill") && svg.contains("decode"));
    // A kernel with no arithmetic has no place on the chart's log axis.
    assert!(!svg.contains("embedding_bf16"));
    let png = std::fs::read(out.join("roofline.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        png.len() > 10_000,
        "a 1200 x 800 chart with content, got {} bytes",
        png.len()
    );
}

#[test]
fn a_bad_profile_file_is_one_clear_line() {
    let r = rustle(&["profile", "--from", "tests/golden/dequant.json"]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("not a valid profile JSON file"), "{err}");
    assert!(!err.contains("panicked"));
}

/// Runs `rustle <args>` where no GPU opens (no driver here; on the GPU machine none visible,
/// `CUDA_VISIBLE_DEVICES` empty) and returns its one error line, after checking the run
/// failed with exactly one and no panic.
fn no_gpu_error(args: &[&str]) -> String {
    let bin = std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
    let r = Command::new(bin)
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    assert!(!r.status.success(), "{args:?}");
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rustle: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{args:?}: {err}");
    errors[0].to_owned()
}

/// The default profile is the GPU's: without one, one line that says so and what runs
/// without it (`--device cpu`, `--from`).
#[test]
fn without_a_gpu_the_profile_says_what_runs() {
    let line = no_gpu_error(&["profile", "--steps", "1"]);
    assert!(
        line.contains("GPU: ") && line.contains("`--device cpu`"),
        "{line}"
    );
}

/// `rustle bench` without a GPU, each of its GPU modes: one line that says what runs
/// without one.
#[test]
fn without_a_gpu_the_bench_says_what_runs() {
    for args in [
        &["bench"][..],
        &["bench", "--batch", "2"],
        &["bench", "--lesson"],
        #[cfg(feature = "probes")]
        &["bench", "--boundaries"],
    ] {
        let line = no_gpu_error(args);
        assert!(
            line.contains("`rustle bench --serve --cpu`"),
            "{args:?}: {line}"
        );
    }
}

/// The CPU profile end to end on the tiny Llama 3: every operation of the forward appears,
/// with the CPU's own ceilings; decode's matmuls do far less arithmetic per byte than
/// prefill's.
#[test]
fn cpu_profile_of_a_small_model() {
    let (out, stdout) = profile_into(
        "cpu-profile",
        &[
            "--device",
            "cpu-reference",
            "--model",
            "tests/golden/tiny-llama3",
            "--prompt-len",
            "64",
            "--steps",
            "4",
        ],
    );
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("profile.json")).unwrap()).unwrap();
    assert!(
        p["ceilings"]["bytes_per_s"].as_f64().unwrap() > 1e8
            && p["ceilings"]["flops_per_s"].as_f64().unwrap() > 1e8
    );
    let rows = p["rows"].as_array().unwrap();
    let row = |k: &str, phase: &str| {
        rows.iter()
            .find(|r| r["kernel"] == k && r["phase"] == phase)
            .unwrap_or_else(|| panic!("{k} {phase}: {stdout}"))
    };
    for k in [
        "embedding_f32",
        "rmsnorm_f32",
        "matmul_f32",
        "rope_f32",
        "kv_write_f32",
        "attention_f32",
        "swiglu_f32",
        "residual_add_f32",
    ] {
        row(k, "prefill");
        row(k, "decode");
    }
    let intensity =
        |r: &serde_json::Value| r["flops"].as_f64().unwrap() / r["bytes"].as_f64().unwrap();
    assert!(
        intensity(row("matmul_f32", "prefill")) > 10.0 * intensity(row("matmul_f32", "decode"))
    );
    // 2 layers x 7 matmuls + the head, per decode step.
    assert_eq!(row("matmul_f32", "decode")["calls"], 4 * (2 * 7 + 1));
    assert!(out.join("roofline.png").exists() && out.join("roofline.svg").exists());
}

/// The fast CPU backend's profile on the tiny quantized GGUF: each step of its forward, the
/// matmuls named by their weights' stored type; a decode step's matmuls, per layer q/k/v in
/// one call, o, gate/up in one, down, and the head.
#[test]
fn fast_cpu_profile_of_a_small_quantized_model() {
    let (out, stdout) = profile_into(
        "fast-cpu-profile",
        &[
            "--device",
            "cpu",
            "--model",
            "tests/golden/tiny-quant.gguf",
            "--prompt-len",
            "64",
            "--steps",
            "4",
        ],
    );
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("profile.json")).unwrap()).unwrap();
    let rows = p["rows"].as_array().unwrap();
    let calls = |k: &str, phase: &str| {
        rows.iter()
            .find(|r| r["kernel"] == k && r["phase"] == phase)
            .unwrap_or_else(|| panic!("{k} {phase}: {stdout}"))["calls"]
            .as_u64()
            .unwrap()
    };
    for k in [
        "embedding",
        "rmsnorm_f32",
        "rope_f32",
        "kv_write_bf16",
        "attention_bf16",
        "swiglu_f32",
        "residual_add_f32",
    ] {
        calls(k, "prefill");
        calls(k, "decode");
    }
    // tiny-quant's matmuls by their first matrix: layer 0 q (q4_k), o (q5_0), gate (q4_k),
    // down (q6_k); layer 1 q (q5_0), o (q4_k), gate (q4_k), down (q4_k); the head (q6_k).
    let matmuls: u64 = ["matmul_q4_k", "matmul_q5_0", "matmul_q6_k"]
        .iter()
        .map(|k| calls(k, "decode"))
        .sum();
    assert_eq!(matmuls, 4 * (2 * 4 + 1));
    assert!(p["device"].as_str().unwrap().contains("the fast backend"));
}

/// A profile that measured the `mma.sync` peak (GPU profiles do; older files and CPU ones
/// have none): the table names it beside rustle's GEMM, and the chart draws it as a second,
/// lower roof.
#[test]
fn the_tensor_instruction_peak_is_shown_when_measured() {
    let mut p: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/profile-example.json").unwrap(),
    )
    .unwrap();
    p["ceilings"]["mma_peak_flops_per_s"] = serde_json::json!(600e12);
    let file = std::env::temp_dir().join(format!("rustle-mma-{}.json", std::process::id()));
    std::fs::write(&file, p.to_string()).unwrap();
    let (out, stdout) = profile_into("mma-profile", &["--from", file.to_str().unwrap()]);
    assert!(stdout.contains("mma.sync peak 600.0 TFLOP/s"), "{stdout}");
    let svg = std::fs::read_to_string(out.join("roofline.svg")).unwrap();
    assert!(svg.contains("mma.sync peak: 600.0 TFLOP/s"), "{svg}");
    // Without the field (the fixture as saved), neither appears.
    let (out, stdout) = profile_into(
        "no-mma-profile",
        &["--from", "tests/fixtures/profile-example.json"],
    );
    assert!(!stdout.contains("mma.sync"), "{stdout}");
    assert!(
        !std::fs::read_to_string(out.join("roofline.svg"))
            .unwrap()
            .contains("mma.sync")
    );
}

/// A CPU profile's caches: an operation whose bytes per call fit one is held to that cache's
/// bandwidth (the table's bound column names it, the chart draws its slope), not to the
/// memory's, which it could beat; the legend gives small ceilings in their own units.
#[test]
fn operations_in_cache_meet_the_cache_roof() {
    let mut p: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/profile-example.json").unwrap(),
    )
    .unwrap();
    // A CPU's scale: 20 GB/s of memory, 20 GFLOP/s, an L2 of 1 MiB at 200 GB/s.
    p["ceilings"]["bytes_per_s"] = serde_json::json!(20e9);
    p["ceilings"]["flops_per_s"] = serde_json::json!(20e9);
    p["ceilings"]["caches"] =
        serde_json::json!([{"name": "L2", "size": 1 << 20, "bytes_per_s": 200e9}]);
    // 60 calls of 884,736 bytes (128 x 576 floats, read twice and written once) in 2 ms:
    // 26.5 GB/s, faster than memory; 13% of the L2.
    p["rows"] = serde_json::json!([{
        "kernel": "residual_add_f32", "phase": "prefill", "calls": 60, "seconds": 2e-3,
        "bytes": 60 * 884_736u64, "flops": 60 * 73_728u64
    }]);
    let file = std::env::temp_dir().join(format!("rustle-cache-{}.json", std::process::id()));
    std::fs::write(&file, p.to_string()).unwrap();
    let (out, stdout) = profile_into("cache-profile", &["--from", file.to_str().unwrap()]);
    assert!(
        stdout.contains("caches: L2 (1024 KiB a core) 200.0 GB/s"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("residual_add_f32"))
        .unwrap();
    assert!(
        line.trim_end().ends_with("L2") && line.contains("13.3%"),
        "{line}"
    );
    let svg = std::fs::read_to_string(out.join("roofline.svg")).unwrap();
    assert!(
        svg.contains("memory 20.0 GB/s, compute 20.0 GFLOP/s") && svg.contains("L2 cache"),
        "{svg}"
    );
}
