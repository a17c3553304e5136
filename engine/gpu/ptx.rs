//! The kernels as `build.rs` compiled them: PTX text for three targets, embedded in the
//! binary, and which one a GPU runs.

/// The kernels, as PTX text for sm_80 and later (the driver compiles it when it loads).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm_80.ptx"));
/// The same kernels for sm_90 and later, with programmatic dependent launch: each kernel
/// waits (`griddepcontrol.wait`) for the one before it, so the launch may start it early.
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm_90.ptx"));
/// The sm_90 kernels and Hopper's warpgroup GEMM (`gemm_wgmma_bf16`): PTX for sm_90a, which
/// runs on compute capability 9.0 alone.
pub const PTX_SM90A: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm_90a.ptx"));

/// The build a GPU of compute capability `major.minor` runs, and its name for messages.
pub fn ptx_for(major: i32, minor: i32) -> (&'static str, &'static str) {
    match (major, minor) {
        (9, 0) => (PTX_SM90A, "PTX 8.0 / sm_90a"),
        (9.., _) => (PTX_SM90, "PTX 7.8 / sm_90"),
        _ => (PTX_SM80, "PTX 7.0 / sm_80"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_holds_every_kernel_in_the_table() {
        let builds = [
            (super::PTX_SM80, "sm_80"),
            (super::PTX_SM90, "sm_90"),
            (super::PTX_SM90A, "sm_90a"),
        ];
        for (ptx, target) in builds {
            assert!(ptx.contains(&format!(".target {target}\n")), "{target}");
            for name in crate::gpu::kernels::table::Kernels::NAMES {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{name} missing from the {target} PTX"
                );
            }
            // The warpgroup GEMM is in the sm_90a build alone: other targets cannot run it.
            let wgmma = ptx.contains(".entry gemm_wgmma_bf16(");
            assert_eq!(wgmma, target == "sm_90a", "{target}");
        }
        // Only the sm_90 builds wait on the kernel before it.
        assert!(super::PTX_SM90.contains("griddepcontrol.wait"));
        assert!(super::PTX_SM90A.contains("griddepcontrol.wait"));
        assert!(!super::PTX_SM80.contains("griddepcontrol"));
    }

    /// Every struct a kernel takes by value (`kernel_args`) is a parameter of its
    /// `#[repr(C)]` bytes, 4-byte aligned, in every build: what the launch copies into it.
    #[test]
    fn kernels_take_argument_structs_as_their_bytes() {
        let sizes: Vec<usize> = crate::kernel_args::BY_VALUE.iter().map(|b| b.1).collect();
        for ptx in [super::PTX_SM80, super::PTX_SM90, super::PTX_SM90A] {
            let structs: Vec<&str> = ptx
                .lines()
                .filter(|l| l.trim_start().starts_with(".param .align"))
                .collect();
            assert!(!structs.is_empty(), "no kernel takes a struct");
            for line in structs {
                // `.param .align 4 .b8 attention_bf16_param_7[16]`
                let size = line.rsplit('[').next().and_then(|s| s.split(']').next());
                let size: usize = size.and_then(|s| s.parse().ok()).unwrap();
                assert!(line.contains(".align 4 .b8"), "{line}");
                assert!(
                    sizes.contains(&size),
                    "{line}: no argument struct of {size} bytes"
                );
            }
        }
    }

    #[test]
    fn the_hopper_builds_cap_the_registers_tiles_names() {
        use crate::tiles::REGISTER_CAPS;
        let builds = [
            (super::PTX_SM80, false),
            (super::PTX_SM90, true),
            (super::PTX_SM90A, true),
        ];
        // The sm_90a build has every kernel the table names.
        for (kernel, _) in REGISTER_CAPS {
            assert!(
                super::PTX_SM90A.contains(&format!(".entry {kernel}(")),
                "{kernel}"
            );
        }
        for (ptx, capped) in builds {
            // The kernels a build has: the warpgroup GEMMs are in the sm_90a one only.
            let kernels: Vec<(&str, usize)> = REGISTER_CAPS
                .into_iter()
                .filter(|(kernel, _)| ptx.contains(&format!(".entry {kernel}(")))
                .collect();
            // Every `.maxnreg` in the PTX is one of the table's (the compiler writes none).
            assert_eq!(
                ptx.matches(".maxnreg").count(),
                capped as usize * kernels.len()
            );
            for (kernel, registers) in kernels {
                let entry = ptx.find(&format!(".entry {kernel}(")).unwrap();
                let params_end = entry + ptx[entry..].find("\n)\n").unwrap() + 3;
                let cap = format!(".maxnreg {registers}\n{{");
                assert_eq!(ptx[params_end..].starts_with(&cap), capped, "{kernel}");
            }
        }
    }

    #[test]
    fn each_gpu_gets_the_newest_build_it_runs() {
        assert_eq!(super::ptx_for(8, 0).1, "PTX 7.0 / sm_80");
        assert_eq!(super::ptx_for(8, 9).1, "PTX 7.0 / sm_80");
        assert_eq!(super::ptx_for(9, 0).1, "PTX 8.0 / sm_90a");
        assert_eq!(super::ptx_for(10, 0).1, "PTX 7.8 / sm_90");
        assert_eq!(super::ptx_for(12, 0).1, "PTX 7.8 / sm_90");
    }
}
