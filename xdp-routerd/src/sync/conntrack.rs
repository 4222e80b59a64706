//! Conntrack entries as domain values, and the pure translation from ctnetlink messages.
