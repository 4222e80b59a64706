//! Host-buildable part of the eBPF crate (empty): cargo needs a library target so that
//! xdp-routerd can name this crate as a build-dependency and rebuild when it changes.
#![no_std]
