//! Launch shapes and sizes shared with the kernels: `gpu-kernels/src/tiles.rs`, the same
//! file, compiled into both (`include!`), so a change there changes both sides.

#![allow(dead_code)]
include!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/gpu-kernels/src/tiles.rs"
));
