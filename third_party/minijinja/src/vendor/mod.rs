pub(crate) mod self_cell;
