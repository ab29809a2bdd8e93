//! Finds libmoelite to link against, in this order:
//! 1. `MOELITE_LIB_DIR`: a directory holding libmoelite.so (or .a with `MOELITE_STATIC=1`);
//! 2. `pkg-config moelite` (an installed package: `cmake --install`);
//! 3. the repository's own build tree, `../../../build/lib` (tools/build.sh).
//! The directory is also put on the run-time search path (rpath) of this package's targets and,
//! through `DEP_MOELITE_LIB_DIR`, of the `moelite` crate's tests and examples, so they run without
//! LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config_lib_dirs() -> Option<Vec<String>> {
    let out = Command::new("pkg-config").args(["--libs-only-L", "moelite"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let dirs: Vec<String> = text.split_whitespace().filter_map(|f| f.strip_prefix("-L")).map(String::from).collect();
    Some(dirs)
}

fn main() {
    println!("cargo:rerun-if-env-changed=MOELITE_LIB_DIR");
    println!("cargo:rerun-if-env-changed=MOELITE_STATIC");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dirs: Vec<String> = if let Ok(dir) = env::var("MOELITE_LIB_DIR") {
        vec![dir]
    } else if let Some(dirs) = pkg_config_lib_dirs() {
        dirs
    } else {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
        let tree = manifest.join("../../../build/lib");
        if !tree.join("libmoelite.so").exists() {
            panic!(
                "libmoelite not found: set MOELITE_LIB_DIR, install moelite (pkg-config moelite), or build it in {}",
                tree.display()
            );
        }
        vec![tree.canonicalize().unwrap().display().to_string()]
    };
    for d in &dirs {
        println!("cargo:rustc-link-search=native={d}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{d}");
    }
    // For dependents' build scripts (DEP_MOELITE_LIB_DIR): link arguments reach only this
    // package's own targets, so a dependent that wants the rpath too adds it itself.
    println!("cargo:lib_dir={}", dirs.join(":"));
    if env::var("MOELITE_STATIC").as_deref() == Ok("1") {
        // The static archive needs the C++ runtime and the system libraries the shared one links.
        println!("cargo:rustc-link-lib=static=moelite");
        for lib in ["stdc++", "m", "dl", "pthread"] {
            println!("cargo:rustc-link-lib={lib}");
        }
    } else {
        println!("cargo:rustc-link-lib=dylib=moelite");
    }
}
