//! mica-engine
