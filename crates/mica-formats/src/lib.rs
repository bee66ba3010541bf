//! mica-formats
