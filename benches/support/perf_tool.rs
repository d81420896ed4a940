//! librdkafka's own load tool, `rdkafka_performance`, built from the
//! sources the `rdkafka-sys` crate vendors against the static library it
//! built (with OpenSSL), once, into target/. Shared by the benchmarks.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `rdkafka_performance`, built once into target/.
pub fn perf_tool() -> PathBuf {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/rdkafka_performance-ssl");
    if out.exists() {
        return out;
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    // The newest build of it: older ones (before the ssl feature) may linger.
    let lib = newest(&target, "librdkafka.a", |p| p.to_string_lossy().contains("rdkafka-sys")).expect("librdkafka.a under target/ (cargo builds it with the rdkafka crate)");
    let zstd = find(&target, "libzstd.a", |_| true).expect("libzstd.a under target/");
    let home = std::env::var("CARGO_HOME").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cargo"));
    let src = find(&home.join("registry/src"), "rdkafka_performance.c", |p| p.to_string_lossy().contains("rdkafka-sys")).expect("librdkafka's sources in the cargo registry");
    let root = src.parent().unwrap().parent().unwrap();
    let built = lib.parent().unwrap();
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .arg(format!("-I{}", root.join("src").display()))
        .arg(format!("-I{}", built.display()))
        .arg(&lib)
        .arg(&zstd)
        // librdkafka is built with OpenSSL (the tests speak SSL and SCRAM).
        .args(["-lssl", "-lcrypto", "-lpthread", "-lm", "-ldl", "-lrt", "-lz"])
        .status()
        .expect("cc");
    assert!(status.success(), "building rdkafka_performance failed");
    out
}

fn newest(dir: &Path, name: &str, want: impl Fn(&Path) -> bool + Copy) -> Option<PathBuf> {
    let mut all = Vec::new();
    find_all(dir, name, want, &mut all);
    all.into_iter().max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

fn find_all(dir: &Path, name: &str, want: impl Fn(&Path) -> bool + Copy, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) && want(&p) {
            out.push(p.clone());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            find_all(&p, name, want, out);
        }
    }
}

fn find(dir: &Path, name: &str, want: impl Fn(&Path) -> bool + Copy) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) && want(&p) {
            return Some(p);
        }
        if e.file_type().ok()?.is_dir() {
            if let Some(f) = find(&p, name, want) {
                return Some(f);
            }
        }
    }
    None
}

