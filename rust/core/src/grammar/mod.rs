//! Constrained decoding: vocabularies, token trie, regex automata, bitmaps.
