//! `GET /metrics`: Prometheus text exposition.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::engine::state::AppState;

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // vLLM's names are copies of the engine's published counts, taken now so that they are
    // as fresh as the `sluice_*` series they render beside.
    for model in state.loaded_models() {
        model.vllm_metrics.update(&model.engine.stats());
        let max_loras = model.limits().max_loras;
        if model.loras.is_some() && max_loras > 0 {
            crate::observe::vllm_metrics::VllmMetrics::update_lora(
                &model.engine.lora_usage(),
                max_loras,
            );
        }
    }
    if let Some(models) = state.models() {
        crate::observe::metrics::record_models(&models.states());
    }
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics().render(),
    )
}
