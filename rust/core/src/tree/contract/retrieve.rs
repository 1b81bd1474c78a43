//! Retrieve indices: the root-to-leaf paths of a tree, one row per leaf.

/// One row per leaf (in index order): the node indices from the root to the leaf, padded
/// with -1 to `max_depth + 1` columns. Returns (rows, columns, data).
pub fn retrieve_indices(parents: &[i32], depths: &[i32]) -> (usize, usize, Vec<i32>) {
    let n = parents.len();
    let mut has_child = vec![false; n];
    for &p in parents.iter().skip(1) {
        if p >= 0 {
            has_child[p as usize] = true;
        }
    }
    let cols = depths.iter().copied().max().unwrap_or(0) as usize + 1;
    let leaves: Vec<usize> = (0..n)
        .filter(|&i| !has_child[i] && (i == 0 || parents[i] >= 0))
        .collect();
    let mut data = vec![-1i32; leaves.len() * cols];
    for (row, &leaf) in leaves.iter().enumerate() {
        let mut node = leaf as i32;
        let mut d = depths[leaf] as usize;
        while node >= 0 {
            data[row * cols + d] = node;
            node = parents[node as usize];
            d = d.wrapping_sub(1);
        }
    }
    (leaves.len(), cols, data)
}
