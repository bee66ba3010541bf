//! Block formats (being written).
