//! Keeping the datapath maps in step with the kernel.
pub mod conntrack;
pub mod ctnetlink;
pub mod qdisc;
pub mod rtnl;
