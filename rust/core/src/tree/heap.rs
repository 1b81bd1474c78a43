//! A binary min-heap of packed `u128` items (order key in the high bits), small and hot.

pub(super) struct MinHeap(Vec<u128>);

impl MinHeap {
    pub(super) fn with_capacity(n: usize) -> Self {
        MinHeap(Vec::with_capacity(n))
    }

    #[inline(always)]
    pub(super) fn first(&self) -> Option<u128> {
        self.0.first().copied()
    }

    #[inline(always)]
    pub(super) fn push(&mut self, h: u128) {
        let v = &mut self.0;
        let mut i = v.len();
        v.push(h);
        while i > 0 {
            let p = (i - 1) / 2;
            let pv = v[p];
            if h >= pv {
                break;
            }
            v[i] = pv;
            i = p;
        }
        v[i] = h;
    }

    /// Replace the top with `h` (or remove it when `h` is None) and restore the order.
    /// The heap must not be empty.
    #[inline(always)]
    pub(super) fn replace_top(&mut self, h: Option<u128>) {
        let v = &mut self.0;
        let h = match h {
            Some(h) => h,
            None => {
                let last = v.pop().expect("replace_top on an empty heap");
                if v.is_empty() {
                    return;
                }
                last
            }
        };
        // Sift `h` down from the root, stopping as soon as it is not behind the better child.
        let n = v.len();
        let mut i = 0;
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let mut c = l;
            let mut cv = v[l];
            if l + 1 < n {
                let rv = v[l + 1];
                if rv < cv {
                    c = l + 1;
                    cv = rv;
                }
            }
            if h <= cv {
                break;
            }
            v[i] = cv;
            i = c;
        }
        v[i] = h;
    }
}
