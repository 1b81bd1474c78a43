//! Position ids of the nodes.

/// RoPE position of every node: `prefix_len + depth` (the root sits at `prefix_len`, right
/// after the committed prefix), never the packed index.
pub fn position_ids(depths: &[i32], prefix_len: i64) -> Vec<i64> {
    depths.iter().map(|&d| prefix_len + d as i64).collect()
}
