//! Shared helpers for the privileged tests (run as root by `cargo xtask test`).
pub mod bpf_sys;
pub mod fixture_net;
pub mod netns;
pub mod packet;
pub mod testbed;
