fn main() {
    let obj = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"));
    println!("{}", obj.len());
}
