//! Every environment variable the engine reads, parsed in one place, each with the values it
//! takes. README.md's "Environment" section lists the same, with what each does and its
//! default. A value a variable does not take is an error that names the variable, the value
//! and what it wants, never the default in silence; an empty value is the variable unset.
//! `rustle` checks them all before any command runs, so that a bad one is one line whether
//! or not the machine has a GPU.
//!
//! The defaults live where the values are used (`Gpu::new`, `Features::detect`, ...): a
//! field here is `None` where the variable is unset.

use std::ffi::OsString;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::tiles::{QUANT_MAX_TOKENS, STREAM_BARRIER_BYTES, STREAM_MAX_SHARED_BYTES};

/// Every variable `Knobs` reads (README.md lists each).
pub const NAMES: [&str; 14] = [
    "RUSTLE_MODEL",
    "RUSTLE_API_KEY",
    "RUSTLE_PIP",
    "XDG_CACHE_HOME",
    "RUSTLE_CPU_PORTABLE",
    "RUSTLE_PTX",
    "RUSTLE_PDL",
    "RUSTLE_GEMV_STREAM",
    "RUSTLE_STREAM_BYTES",
    "RUSTLE_STREAM_ONE_BYTES",
    "RUSTLE_STREAM_MIN_ROWS",
    "RUSTLE_GEMV_TOKENS",
    "RUSTLE_GEMV_MMA_TOKENS",
    "RUSTLE_GEMM_TUNE",
];

/// The streamed GEMVs' shared memory a block, in bytes: at most what a block may ask for,
/// less the stages' barriers (`stream_plan` in `gpu/kernels/gemv_codes.rs`).
const STREAM_BYTES: RangeInclusive<usize> = 1..=STREAM_MAX_SHARED_BYTES - STREAM_BARRIER_BYTES;

/// What the environment says; `None` (or `false`) where a variable is unset or empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// `RUSTLE_MODEL`: the model when `--model` is not given.
    pub model: Option<PathBuf>,
    /// `RUSTLE_API_KEY`: `rustle serve`'s key when `--api-key` is not given.
    pub api_key: Option<String>,
    /// `RUSTLE_PIP`: the command that runs pip to fetch the default model, split on spaces.
    pub pip: Option<Vec<String>>,
    /// `XDG_CACHE_HOME`: the default model is cached in its `rustle/`.
    pub cache_home: Option<PathBuf>,
    /// `RUSTLE_CPU_PORTABLE=1`: the CPU kernels' plain-Rust forms only.
    pub cpu_portable: bool,
    /// `RUSTLE_PTX`: the kernels loaded from this PTX file instead of the built-in build.
    pub ptx: Option<PathBuf>,
    /// `RUSTLE_PDL`: programmatic dependent launch (Hopper and later) on or off.
    pub pdl: Option<bool>,
    /// `RUSTLE_GEMV_STREAM`: the streamed GEMVs (sm_90a) on or off.
    pub gemv_stream: Option<bool>,
    /// `RUSTLE_STREAM_BYTES`: the streamed gate-and-up GEMV's shared memory a block.
    pub stream_bytes: Option<usize>,
    /// `RUSTLE_STREAM_ONE_BYTES`: the streamed GEMV of one matrix's shared memory a block.
    pub stream_one_bytes: Option<usize>,
    /// `RUSTLE_STREAM_MIN_ROWS`: the fewest rows of a matrix whose GEMV streams.
    pub stream_min_rows: Option<usize>,
    /// `RUSTLE_GEMV_TOKENS`: the most tokens of a decode step the integer GEMV takes.
    pub gemv_tokens: Option<usize>,
    /// `RUSTLE_GEMV_MMA_TOKENS`: the fewest tokens the integer GEMV takes on the tensor
    /// cores (`QUANT_MAX_TOKENS + 1`: none).
    pub gemv_mma_tokens: Option<usize>,
    /// `RUSTLE_GEMM_TUNE`: the warpgroup GEMM's plans measured on this GPU (on) or
    /// estimated (off).
    pub gemm_tune: Option<bool>,
}

impl Knobs {
    /// The process's environment, every variable checked.
    pub fn from_env() -> Result<Knobs> {
        Knobs::parse(|name| std::env::var_os(name))
    }

    /// The variables as `var` gives them (`None`: unset).
    pub fn parse(var: impl Fn(&str) -> Option<OsString>) -> Result<Knobs> {
        // Unset and empty are the same: `RUSTLE_X= rustle ...` unsets it for one run.
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let text = |name: &'static str| get(name).map(|v| utf8(name, v)).transpose();
        let number = |name: &'static str, range: RangeInclusive<usize>| {
            text(name)?.map(|v| whole(name, &v, range)).transpose()
        };
        let on_off = |name: &'static str| text(name)?.map(|v| switch(name, &v)).transpose();
        Ok(Knobs {
            model: get("RUSTLE_MODEL").map(PathBuf::from),
            api_key: text("RUSTLE_API_KEY")?,
            pip: text("RUSTLE_PIP")?
                .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .filter(|words| !words.is_empty()),
            cache_home: get("XDG_CACHE_HOME").map(PathBuf::from),
            cpu_portable: on_off("RUSTLE_CPU_PORTABLE")?.unwrap_or(false),
            ptx: get("RUSTLE_PTX").map(PathBuf::from),
            pdl: on_off("RUSTLE_PDL")?,
            gemv_stream: on_off("RUSTLE_GEMV_STREAM")?,
            stream_bytes: number("RUSTLE_STREAM_BYTES", STREAM_BYTES)?,
            stream_one_bytes: number("RUSTLE_STREAM_ONE_BYTES", STREAM_BYTES)?,
            stream_min_rows: number("RUSTLE_STREAM_MIN_ROWS", 0..=u32::MAX as usize)?,
            gemv_tokens: number("RUSTLE_GEMV_TOKENS", 1..=QUANT_MAX_TOKENS)?,
            gemv_mma_tokens: number("RUSTLE_GEMV_MMA_TOKENS", 1..=QUANT_MAX_TOKENS + 1)?,
            gemm_tune: on_off("RUSTLE_GEMM_TUNE")?,
        })
    }
}

/// `value` as text, or the error that says it is not.
fn utf8(name: &'static str, value: OsString) -> Result<String> {
    value.into_string().map_err(|v| Error::Knob {
        name,
        value: v.to_string_lossy().into_owned(),
        want: "UTF-8 text".into(),
    })
}

/// A whole number in `range`.
pub fn whole(name: &'static str, value: &str, range: RangeInclusive<usize>) -> Result<usize> {
    value
        .parse()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| Error::Knob {
            name,
            value: value.into(),
            want: format!("a whole number from {} to {}", range.start(), range.end()),
        })
}

/// `0` (off) or `1` (on).
pub fn switch(name: &'static str, value: &str) -> Result<bool> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(Error::Knob {
            name,
            value: value.into(),
            want: "0 (off) or 1 (on)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Knobs> {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        Knobs::parse(|name| vars.get(name).map(OsString::from))
    }

    fn error(vars: &[(&str, &str)]) -> String {
        parse(vars).unwrap_err().to_string()
    }

    #[test]
    fn nothing_set_is_every_default() {
        assert_eq!(parse(&[]).unwrap(), Knobs::default());
    }

    #[test]
    fn whole_numbers_in_their_range() {
        assert_eq!(whole("X", "8", 1..=8).unwrap(), 8);
        assert_eq!(whole("X", "1", 1..=8).unwrap(), 1);
        for bad in [
            "0",
            "9",
            "abc",
            "-1",
            "2.5",
            " 2",
            "2 ",
            "0x2",
            "99999999999999999999999",
        ] {
            assert_eq!(
                whole("X", bad, 1..=8).unwrap_err().to_string(),
                format!("X={bad}: want a whole number from 1 to 8"),
            );
        }
    }

    #[test]
    fn switches_are_0_or_1() {
        assert!(!switch("X", "0").unwrap());
        assert!(switch("X", "1").unwrap());
        for bad in ["2", "on", "true", "yes", "01"] {
            assert_eq!(
                switch("X", bad).unwrap_err().to_string(),
                format!("X={bad}: want 0 (off) or 1 (on)"),
            );
        }
    }

    #[test]
    fn a_bad_value_is_an_error_naming_it() {
        assert_eq!(
            error(&[("RUSTLE_GEMV_TOKENS", "abc")]),
            "RUSTLE_GEMV_TOKENS=abc: want a whole number from 1 to 8"
        );
        // Once clamped to 8 in silence.
        assert_eq!(
            error(&[("RUSTLE_GEMV_TOKENS", "16")]),
            "RUSTLE_GEMV_TOKENS=16: want a whole number from 1 to 8"
        );
        assert_eq!(
            error(&[("RUSTLE_GEMV_MMA_TOKENS", "0")]),
            "RUSTLE_GEMV_MMA_TOKENS=0: want a whole number from 1 to 9"
        );
        assert_eq!(
            error(&[("RUSTLE_STREAM_BYTES", "50K")]),
            "RUSTLE_STREAM_BYTES=50K: want a whole number from 1 to 232320"
        );
        assert_eq!(
            error(&[("RUSTLE_STREAM_ONE_BYTES", "300000")]),
            "RUSTLE_STREAM_ONE_BYTES=300000: want a whole number from 1 to 232320"
        );
        assert_eq!(
            error(&[("RUSTLE_STREAM_MIN_ROWS", "-1")]),
            "RUSTLE_STREAM_MIN_ROWS=-1: want a whole number from 0 to 4294967295"
        );
        // Once "anything but 0" in silence.
        assert_eq!(
            error(&[("RUSTLE_PDL", "off")]),
            "RUSTLE_PDL=off: want 0 (off) or 1 (on)"
        );
        assert_eq!(
            error(&[("RUSTLE_GEMV_STREAM", "no")]),
            "RUSTLE_GEMV_STREAM=no: want 0 (off) or 1 (on)"
        );
        assert_eq!(
            error(&[("RUSTLE_CPU_PORTABLE", "true")]),
            "RUSTLE_CPU_PORTABLE=true: want 0 (off) or 1 (on)"
        );
    }

    #[test]
    fn good_values_are_read() {
        let k = parse(&[
            ("RUSTLE_MODEL", "m.gguf"),
            ("RUSTLE_API_KEY", "sekret"),
            ("RUSTLE_PIP", "  python3.12  -m pip "),
            ("XDG_CACHE_HOME", "/c"),
            ("RUSTLE_CPU_PORTABLE", "1"),
            ("RUSTLE_PTX", "v.ptx"),
            ("RUSTLE_PDL", "0"),
            ("RUSTLE_GEMV_STREAM", "1"),
            ("RUSTLE_STREAM_BYTES", "65536"),
            ("RUSTLE_STREAM_ONE_BYTES", "232320"),
            ("RUSTLE_STREAM_MIN_ROWS", "0"),
            ("RUSTLE_GEMV_TOKENS", "8"),
            ("RUSTLE_GEMV_MMA_TOKENS", "9"),
            ("RUSTLE_GEMM_TUNE", "0"),
        ])
        .unwrap();
        let want = Knobs {
            model: Some("m.gguf".into()),
            api_key: Some("sekret".into()),
            pip: Some(vec!["python3.12".into(), "-m".into(), "pip".into()]),
            cache_home: Some("/c".into()),
            cpu_portable: true,
            ptx: Some("v.ptx".into()),
            pdl: Some(false),
            gemv_stream: Some(true),
            stream_bytes: Some(65536),
            stream_one_bytes: Some(232320),
            stream_min_rows: Some(0),
            gemv_tokens: Some(8),
            gemv_mma_tokens: Some(9),
            gemm_tune: Some(false),
        };
        assert_eq!(k, want);
    }

    /// `RUSTLE_X= rustle ...` is the variable unset, whatever it takes.
    #[test]
    fn empty_is_unset() {
        let all: Vec<(&str, &str)> = NAMES.iter().map(|&n| (n, "")).collect();
        assert_eq!(parse(&all).unwrap(), Knobs::default());
        assert_eq!(parse(&[("RUSTLE_PIP", "   ")]).unwrap().pip, None);
    }

    #[cfg(unix)]
    #[test]
    fn text_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let key = OsString::from_vec(b"se\xffret".to_vec());
        let e = Knobs::parse(|name| (name == "RUSTLE_API_KEY").then(|| key.clone()));
        assert_eq!(
            e.unwrap_err().to_string(),
            "RUSTLE_API_KEY=se\u{fffd}ret: want UTF-8 text"
        );
        // A path need not be text.
        let model = Knobs::parse(|name| (name == "RUSTLE_MODEL").then(|| key.clone()));
        assert!(model.unwrap().model.is_some());
    }

    /// `NAMES` is what `parse` reads, and README.md's "Environment" section lists each.
    #[test]
    fn names_are_what_parse_reads_and_the_readme_lists() {
        let asked = RefCell::new(vec![]);
        Knobs::parse(|name| {
            asked.borrow_mut().push(name.to_owned());
            None
        })
        .unwrap();
        assert_eq!(asked.into_inner(), NAMES);
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let section = readme
            .split("\n## Environment\n")
            .nth(1)
            .expect("README.md has an \"## Environment\" section");
        let section = section.split("\n## ").next().unwrap();
        for name in NAMES {
            assert!(
                section.contains(&format!("| `{name}` |")),
                "README.md's Environment table lacks {name}"
            );
        }
    }

    /// No other file of the engine reads the environment: a knob added elsewhere would
    /// escape both the start-up check and the README's list.
    #[test]
    fn only_this_file_reads_the_environment() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![];
        walk(&root.join("engine"), &mut files);
        let mut found = vec![];
        for f in files {
            if f.ends_with("engine/knobs.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                // A speed test's own knob (`cargo test -- --ignored fused_speed`).
                let test_only = line.contains("RUSTLE_SPEED_ROWS");
                if (line.contains("env::var") || line.contains("var_os(")) && !test_only {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "read outside knobs.rs:\n{}",
            found.join("\n")
        );
    }
}
