//! Compiles `gpu-kernels/` to PTX and hands it to the engine as `$OUT_DIR/kernels_TARGET.ptx`,
//! with the list of the kernels it holds (`$OUT_DIR/kernel_table.rs`, the engine's kernel
//! table: `write_kernel_table`).
//!
//! The kernels need a pinned nightly (named in `gpu-kernels/rust-toolchain.toml`) with
//! `rust-src`, because the `nvptx64-nvidia-cuda` target has no prebuilt `core` and needs
//! `-Zbuild-std`. The host itself is stable Rust. rustup no longer installs a missing
//! toolchain on its own, so this script installs it once, so that `cargo run` and
//! `cargo test` work on a machine that has only rustup and a stable toolchain.
//! Nothing from NVIDIA is needed to build: the PTX is text, compiled by the driver at load.
//! The one thing the Rust source cannot say, a kernel's most registers a thread (CUDA C++'s
//! `__launch_bounds__`), this script writes into the PTX (`REGISTER_CAPS` in
//! `gpu-kernels/src/tiles.rs`).
//!
//! The host's `probes` feature (`CARGO_FEATURE_PROBES`) turns on the kernels' own, which
//! adds the measurement experiments `rustle bench --boundaries` runs; a default build's PTX
//! holds none of them.
//!
//! Cargo runs this script with no arguments. Run by hand, it builds a variant of the kernels
//! (`scripts/variant-ptx.sh` compiles it with `rustc` and runs it so): `--cpu TARGET` builds
//! that target alone, and each `--cfg NAME` adds `--cfg NAME` to the kernels' build, into
//! `$OUT_DIR/kernels_TARGET.ptx`, register caps written in as here.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The launch facts the kernels and the engine share, of which the build needs
/// `REGISTER_CAPS`.
#[allow(dead_code)]
mod tiles {
    include!("gpu-kernels/src/tiles.rs");
}

/// The kernels are built three times: for sm_80, whose PTX JIT-compiles on Ampere, Ada and
/// later; for sm_90 (PTX 7.8), where Hopper's programmatic dependent launch
/// (`griddepcontrol`) lets a kernel start while the one before it drains; and for sm_90a
/// (PTX 8.0), which adds the warpgroup GEMM (`wgmma`, Hopper alone: PTX for an "a" target
/// runs on that compute capability only). The engine loads the newest one the GPU runs.
const TARGET_CPUS: &[&str] = &["sm_80", "sm_90", "sm_90a"];

/// Variables the outer cargo/rustup set that would leak into the inner build: the outer
/// `RUSTUP_TOOLCHAIN` beats toolchain files, and the rest describe the host build.
const LEAKY_VARS: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO",
    "CARGO_BUILD_TARGET",
    "CARGO_MAKEFLAGS",
];

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = root.join("gpu-kernels");
    for p in ["src", "Cargo.toml", "rust-toolchain.toml"] {
        println!("cargo:rerun-if-changed={}", kernels.join(p).display());
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let variant = Variant::from_args(env::args().skip(1));
    let probes = env::var_os("CARGO_FEATURE_PROBES").is_some();
    let toolchain = pinned_toolchain(&kernels);
    ensure_toolchain(&kernels, &toolchain, &out_dir);
    let mut built = vec![];
    for cpu in &variant.cpus {
        let ptx = build_ptx(&kernels, &out_dir, &toolchain, cpu, probes, &variant.cfgs);
        let mut text = fs::read_to_string(&ptx)
            .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", ptx.display())));
        if cpu.starts_with("sm_90") {
            for (kernel, registers) in tiles::REGISTER_CAPS {
                // The warpgroup kernels are in the sm_90a build only.
                if *cpu == "sm_90a" || has_entry(&text, kernel) {
                    text = cap_registers(&text, kernel, registers);
                }
            }
        }
        let dest = out_dir.join(format!("kernels_{cpu}.ptx"));
        fs::write(&dest, &text).unwrap_or_else(|e| {
            fail(&format!("cannot write {}: {e}", dest.display()));
        });
        built.push((*cpu, text));
    }
    if variant.cpus == TARGET_CPUS {
        write_kernel_table(&out_dir, &built);
    }
}

/// The start of `kernel`'s entry in a PTX file.
fn entry_line(kernel: &str) -> String {
    format!(".visible .entry {kernel}(")
}

/// Whether a PTX file has an entry named `kernel`.
fn has_entry(ptx: &str, kernel: &str) -> bool {
    ptx.contains(&entry_line(kernel))
}

/// The kernels a PTX file holds: its `.entry` names, in order.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// `$OUT_DIR/kernel_table.rs`, the list the engine's kernel table is made of
/// (`engine/gpu/kernels/table.rs`): a field for every kernel of the sm_80 build, which
/// every build has, and an optional one for each kernel the Hopper builds add. A new kernel
/// is in the table once it is in the PTX.
fn write_kernel_table(out_dir: &Path, built: &[(&str, String)]) {
    let (_, sm80) = built
        .iter()
        .find(|b| b.0 == "sm_80")
        .expect("the sm_80 build");
    let every = entries(sm80);
    let mut optional: Vec<&str> = vec![];
    for (cpu, ptx) in built {
        let names = entries(ptx);
        if let Some(missing) = every.iter().find(|k| !names.contains(k)) {
            fail(&format!(
                "kernel {missing} is in the sm_80 PTX but not the {cpu} one"
            ));
        }
        for k in names {
            if !every.contains(&k) && !optional.contains(&k) {
                optional.push(k);
            }
        }
    }
    let mut text = String::from(
        "// Made by build.rs from the kernels' PTX (`write_kernel_table`): every kernel of the\n\
         // sm_80 build, then those the Hopper builds add. Edit the kernels, not this file.\n\
         kernel_table!(\n",
    );
    for k in &every {
        text.push_str(&format!("    {k},\n"));
    }
    text.push_str("    ;\n    optional:\n");
    for k in &optional {
        text.push_str(&format!("    {k},\n"));
    }
    text.push_str(");\n");
    let dest = out_dir.join("kernel_table.rs");
    fs::write(&dest, text)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", dest.display())));
}

/// What to build: every target with no extra `--cfg` (cargo's run), or what the command line
/// asks for (a variant, `scripts/variant-ptx.sh`).
struct Variant {
    cpus: Vec<&'static str>,
    cfgs: Vec<String>,
}

impl Variant {
    fn from_args(mut args: impl Iterator<Item = String>) -> Variant {
        let mut v = Variant {
            cpus: vec![],
            cfgs: vec![],
        };
        while let Some(arg) = args.next() {
            let value = args
                .next()
                .unwrap_or_else(|| fail(&format!("{arg} wants a value")));
            match arg.as_str() {
                "--cpu" => match TARGET_CPUS.iter().find(|&&c| c == value) {
                    Some(cpu) => v.cpus.push(cpu),
                    None => fail(&format!("--cpu {value}: want one of {TARGET_CPUS:?}")),
                },
                "--cfg" if is_identifier(&value) => v.cfgs.push(value),
                "--cfg" => fail(&format!("--cfg {value}: want a name (letters, digits, _)")),
                _ => fail(&format!(
                    "unknown argument {arg}: want --cpu TARGET and --cfg NAME, or none"
                )),
            }
        }
        if v.cpus.is_empty() {
            v.cpus = TARGET_CPUS.to_vec();
        }
        v
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `ptx` with `.maxnreg registers` after `kernel`'s parameter list: `ptxas` then keeps the
/// kernel within that many registers a thread (`tiles::REGISTER_CAPS`). A cap on a kernel
/// the PTX does not have stops the build, so a renamed kernel cannot lose its cap unseen.
fn cap_registers(ptx: &str, kernel: &str, registers: usize) -> String {
    let entry = entry_line(kernel);
    let Some(start) = ptx.find(&entry) else {
        fail(&format!(
            "REGISTER_CAPS names {kernel}, which the kernels' PTX has no entry for"
        ));
    };
    // The parameter list ends at the first line that is a lone `)`.
    let Some(end) = ptx[start..].find("\n)\n").map(|i| start + i + 3) else {
        fail(&format!(
            "{kernel}'s PTX entry has no end to its parameters"
        ));
    };
    format!("{}.maxnreg {registers}\n{}", &ptx[..end], &ptx[end..])
}

/// The `channel = "..."` line of `gpu-kernels/rust-toolchain.toml`: one place names the nightly.
fn pinned_toolchain(kernels: &Path) -> String {
    let file = kernels.join("rust-toolchain.toml");
    let text = fs::read_to_string(&file)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", file.display())));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.split('"').nth(1))
        .next()
        .map(str::to_owned)
        .unwrap_or_else(|| fail(&format!("no channel = \"...\" in {}", file.display())))
}

fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    for var in LEAKY_VARS {
        cmd.env_remove(var);
    }
    cmd
}

fn ensure_toolchain(kernels: &Path, toolchain: &str, out_dir: &Path) {
    let sysroot = rustup()
        .args(["run", toolchain, "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if sysroot.is_some_and(|s| s.join("lib/rustlib/src/rust/library/core").is_dir()) {
        return;
    }
    println!(
        "cargo:warning=installing the kernels' toolchain {toolchain} with rust-src (once, about 15 s)"
    );
    let status = rustup()
        .current_dir(kernels)
        .args(["toolchain", "install", toolchain, "--profile", "minimal"])
        .args(["--component", "rust-src"])
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run rustup ({e}); install rustup first")));
    if !status.success() {
        fail(&format!("`rustup toolchain install {toolchain}` failed"));
    }
    // Cargo shows a build script's warnings again on every build until the script next
    // runs. A file written now, newer than this run's start, makes the next build run it
    // once more: it finds the toolchain, says nothing, and the notice is gone.
    let marker = out_dir.join("toolchain-installed");
    fs::write(&marker, toolchain).unwrap_or_else(|e| fail(&format!("{}: {e}", marker.display())));
    println!("cargo:rerun-if-changed={}", marker.display());
}

/// The kernels' PTX for `cpu`, with the `probes` feature where asked and `--cfg` for each of
/// `cfgs`.
fn build_ptx(
    kernels: &Path,
    out_dir: &Path,
    toolchain: &str,
    cpu: &str,
    probes: bool,
    cfgs: &[String],
) -> PathBuf {
    let target_dir = out_dir.join(format!("gpu-kernels-target-{cpu}"));
    let mut rustflags = format!("-C target-cpu={cpu}");
    for cfg in cfgs {
        rustflags += &format!(" --cfg {cfg}");
    }
    let features: &[&str] = if probes {
        &["--features", "probes"]
    } else {
        &[]
    };
    let output = rustup()
        .current_dir(kernels)
        .args(["run", toolchain, "cargo", "rustc", "--release"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .args(features)
        .args(["--", "--emit=asm", "-Zno-link"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", rustflags)
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo for the kernels: {e}")));
    if !output.status.success() {
        // The compiler's own message, line by line, so cargo shows it.
        for line in String::from_utf8_lossy(&output.stderr).lines() {
            println!("cargo:warning={line}");
        }
        fail("the GPU kernels failed to compile (messages above)");
    }
    // With fat LTO and one codegen unit the whole program, `core` included, is this file.
    let ptx = target_dir.join("nvptx64-nvidia-cuda/release/deps/gpu_kernels.s");
    if !ptx.is_file() {
        fail(&format!(
            "the kernel build left no PTX at {}",
            ptx.display()
        ));
    }
    ptx
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
