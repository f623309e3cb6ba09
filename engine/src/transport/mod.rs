//! Transports move slices of requests between engines. TCP is always present;
//! RDMA will sit beside it behind the same shape.

pub mod tcp;
