//! The ctnetlink socket: dump, events, timeout refresh.
