//! mica-models
