// A stream scope borrows its stream: the stream cannot be dropped while it is current
// through the scope.
use cuda_rt::{AsStream, Stream};

fn main() {
    let s = Stream::new().unwrap();
    let scope = s.enter().unwrap();
    drop(s);
    drop(scope);
}
