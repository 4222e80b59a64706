//! Test-bed plumbing shared by the privileged tests (`tests/`) and the benchmark (`bench/`):
//! network namespaces and the commands run in them, the daemon process driven through its
//! CLI, and the Internet checksum. Errors are `anyhow` results: the tests crate wraps them in
//! calls that panic with the message, the benchmark reports them.
pub mod checksum;
pub mod daemon;
pub mod netns;
