//! Shared helpers for the privileged tests (run as root by `cargo xtask test`).
pub mod netns;
