//! The directory moelite-sys found libmoelite in goes on the run-time search path of this crate's
//! tests and examples, so they run without LD_LIBRARY_PATH. An application's own binary sets its
//! own (docs/bindings.md, "Rust"), or the library is installed where the dynamic loader looks.
fn main() {
    if let Ok(dirs) = std::env::var("DEP_MOELITE_LIB_DIR") {
        for d in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{d}");
            println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{d}");
        }
    }
}
