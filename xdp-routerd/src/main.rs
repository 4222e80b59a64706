fn main() {
    println!("{}", xdp_routerd::datapath::EBPF_OBJECT.len());
}
