//! Shared helpers for the privileged tests.
