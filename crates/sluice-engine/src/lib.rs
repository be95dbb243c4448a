//! sluice-engine: the continuous-batching scheduler, paged block manager, sampler and engine loop.
