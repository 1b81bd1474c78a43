//! A binary min-heap of packed `u128` items (order key in the high bits), small and hot.
//! It is on the build loop's critical path, so it is sized once (no growth check on push)
//! and indexes without bounds checks. It stays binary: a 4-ary heap with branch-free child
//! selection makes every sift step wait on its loads.

pub(super) struct MinHeap(Vec<u128>);

impl MinHeap {
    pub(super) fn with_capacity(n: usize) -> Self {
        MinHeap(Vec::with_capacity(n))
    }

    #[inline(always)]
    pub(super) fn first(&self) -> Option<u128> {
        self.0.first().copied()
    }

    /// Push `h`; the heap must have room (`with_capacity` sized for every item).
    #[inline(always)]
    pub(super) fn push(&mut self, h: u128) {
        let v = &mut self.0;
        let mut i = v.len();
        assert!(i < v.capacity(), "heap capacity exceeded");
        let p = v.as_mut_ptr();
        // SAFETY: i < capacity, and every parent index is below i.
        unsafe {
            v.set_len(i + 1);
            while i > 0 {
                let up = (i - 1) / 2;
                let pv = *p.add(up);
                if h >= pv {
                    break;
                }
                *p.add(i) = pv;
                i = up;
            }
            *p.add(i) = h;
        }
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
        let p = v.as_mut_ptr();
        let mut i = 0;
        // SAFETY: n >= 1 here, and every index read or written is checked against n first.
        unsafe {
            loop {
                let l = 2 * i + 1;
                if l >= n {
                    break;
                }
                let mut c = l;
                let mut cv = *p.add(l);
                if l + 1 < n {
                    let rv = *p.add(l + 1);
                    if rv < cv {
                        c = l + 1;
                        cv = rv;
                    }
                }
                if h <= cv {
                    break;
                }
                *p.add(i) = cv;
                i = c;
            }
            *p.add(i) = h;
        }
    }
}
