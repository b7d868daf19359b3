// A StreamRef may keep its stream alive (a reference count): it is not Copy, so a
// copy cannot escape the count.
use cuda_rt::StreamRef;

fn main() {
    let a = StreamRef::legacy_default(0);
    let b = a;
    let c = a;
    drop((b, c));
}
