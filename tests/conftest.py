"""Imported before any test module: vflsec must load before grpc so that its TLS pin is in force."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import vflsec  # noqa: F401  (sets GRPC_SSL_CIPHER_SUITES before grpc reads it; see proto/vflsec/__init__.py)


@contextmanager
def pinned_initial_weights(seed: int) -> Iterator[None]:
    """Test-only: every split-NN module a service builds in this process starts as the central reference's of
    ``seed`` (parity tests). A deployment draws each module's weights from its holder's OS entropy
    (services/models/splitnn/modules.py own_seed); no RPC, configuration or CLI flag reaches this hook."""
    from vflsec.services.models.splitnn import modules

    drawn = modules.own_seed
    modules.own_seed = lambda: seed
    try:
        yield
    finally:
        modules.own_seed = drawn


# Measured at 5 s or more each (`pytest --durations=0` on a quiet 2-core machine, 2026-11-27: 1,859 s in all), kept out
# of the default run (`-m 'not long'`, pyproject.toml) so that CI on a slower machine of the same kind stays under 20
# minutes; `./scripts/test.sh -m long` runs them. Kept in CI although as long: every test the "what each party learns"
# table cites, and one run per flow (LR, split-NN and tree parity, the demo, the fast reproduction subset, a stop).
MEASURED_LONG = frozenset(
    {
        "tests/e2e/test_demo.py::test_digits_three_passive_parties",
        "tests/e2e/test_demo.py::test_privee_keeps_every_prediction",
        "tests/integration/test_fuzz.py::test_memory_stays_bounded_over_new_messages",
        "tests/e2e/test_demo.py::test_splitnn_coordinator_top_demo",
        "tests/integration/test_compose.py::test_compose_commands_run_as_local_processes",
        "tests/unit/test_psi_scale.py::test_100k_alignment_through_the_pool_is_exact_row_for_row",
        "tests/integration/test_attacks_through_services.py::test_digits_thirty_passive_features",
        "tests/integration/test_bench_cli.py::test_bench_cli_times_the_former_and_todays_defaults",
        "tests/integration/test_attacks_through_services.py::test_score_defenses_raise_attack_error[privee:epsilon=0.1]",
        "tests/integration/test_faults.py::test_killed_parties_resume_to_the_uninterrupted_model[ckks-0.2]",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[privee_pp]",
        "tests/e2e/test_demo.py::test_breast_cancer_ckks_matches_plain",
        "tests/integration/test_attacks_through_services.py::test_score_defenses_raise_attack_error[rounding:decimals=1]",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[privee:epsilon=0.1]",
        "tests/integration/test_attacks_through_services.py::test_digits_five_passive_features_esa_is_exact",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[privee:epsilon=0.1,basis=householder]",
        "tests/integration/test_training.py::test_binary_ckks_matches_plain",
        "tests/integration/test_faults.py::test_killed_parties_resume_to_the_uninterrupted_model[plain-1e-06]",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[gaussian:epsilon=2]",
        "tests/integration/test_netns.py::test_three_hosts_in_network_namespaces",
        "tests/integration/test_param_release.py::test_varasteh_curve_through_the_services[wine]",
        "tests/unit/test_attacks_real_data.py::test_learned_attacks_beat_half_on_held_out_rows[digits]",
        "tests/e2e/test_stop_signal.py::test_a_stopped_run_stops_its_parties_and_removes_its_folder[attack-SIGINT]",
        "tests/unit/test_attacks_splitnn.py::test_grn_beats_half_through_a_released_coordinator_top_model",
        "tests/unit/test_tree_protocol.py::test_ckks_matches_plain_on_digits",
        "tests/integration/test_splitnn_digits.py::test_digits_matches_central[coordinator-top-ckks]",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[rounding:decimals=2]",
        "tests/integration/test_experiment.py::test_cells_as_ray_tasks_on_a_local_instance",
        "tests/integration/test_experiment_pool.py::test_two_cells_in_two_workers_and_a_resumed_rerun",
        "tests/e2e/test_demo.py::test_attack_reports_each_party_process_peak_memory_last",
        "tests/integration/test_param_release.py::test_flip_adds_rassoulis_gap_and_leaves_scores_untouched",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[rank_only]",
        "tests/unit/test_param_defenses.py::test_varasteh_meets_epsilon_and_privacy_grows_with_it[wine]",
        "tests/integration/test_bench_scale.py::test_bench_scale_smallest_grid",
        "tests/integration/test_bench_trees.py::test_bench_trees_reports_both_sides_on_the_same_rows",
        "tests/integration/test_bench_align.py::test_bench_align_json_reports_the_figures_for_two_passive_parties[grpc]",
        "tests/integration/test_param_release.py::test_varasteh_curve_through_the_services[breast_cancer]",
        "tests/integration/test_bench_load.py::test_parties_as_processes_answer_every_request_too",
        "tests/unit/test_tensors_fuzz.py::test_malformed_tensors_are_invalid_argument",
        "tests/integration/test_experiment_resume.py::test_a_killed_run_resumes_with_the_missing_cells_only",
        "tests/unit/test_psi_scale.py::test_20k_alignment_through_the_pool_is_exact_row_for_row",
        "tests/integration/test_start_errors_cli.py::test_a_party_refusing_its_shard_fails_attack_without_naming_a_deleted_log",
        "tests/integration/test_experiment.py::test_a_splitnn_scenario_restores_its_trained_federation_per_cell",
        "tests/integration/test_tree_parity_services.py::test_forest_does_not_follow_the_psi_order",
        "tests/integration/test_bench_align.py::test_bench_align_json_reports_the_figures_for_two_passive_parties[pipes]",
        "tests/unit/test_attacks_learned.py::test_grn_beats_random_guess_and_learns",
        "tests/integration/test_attack_cli_aware.py::test_score_chain_params_reach_the_aware_attacker",
        "tests/unit/test_attacks_binary.py::test_peeling_the_fabricated_bits_finds_a_feature_a_random_q_left_near_the_span[11]",
        "tests/integration/test_start_errors_cli.py::test_a_party_refusing_its_shard_fails_demo_and_serve_cleanly",
        "tests/unit/test_attacks_real_data.py::test_learned_attacks_beat_half_on_held_out_rows[breast_cancer]",
        "tests/unit/test_attacks_aware.py::test_each_aware_attack_is_never_worse_than_its_naive_counterpart[label_only]",
        "tests/integration/test_attacks_through_services.py::test_sign_only_improves_with_more_predictions",
        "tests/integration/test_splitnn_options.py::test_architecture_and_optimiser_options_reach_every_party[coordinator-top]",
        "tests/integration/test_attack_cli_gradient_defense.py::test_dp_gaussian_lowers_the_direction_attack_through_the_services",
        "tests/integration/test_attack_cli_gradient_defense.py::test_the_active_party_refuses_a_bad_gradient_defense_over_the_wire",
        "tests/integration/test_experiment_labels.py::test_a_small_label_leakage_scenario_through_the_services",
        # on ../shared/datasets, which CI has beside the clone (measured in CI's run: 8-33 s each)
        "tests/integration/test_half_levels_cli.py::test_half_level_with_target_encoding_is_the_papers[adult]",
        "tests/integration/test_half_levels_cli.py::test_half_level_with_target_encoding_is_the_papers[bank]",
        "tests/unit/test_splitnn_bank.py::test_bank_trains_federated",
        "tests/e2e/test_reproduce_packaged.py::test_claims_run_from_the_installed_package_alone[ye_alg1_covid]",
    }
)
# Every paper claim beyond the fast subset (Bank and satellite claims take minutes each): `vflsec reproduce` measures
# them; CI runs the fast subset.
LONG_PREFIXES = ("tests/e2e/test_reproduce.py::test_slow_claim",)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid in MEASURED_LONG or item.nodeid.startswith(LONG_PREFIXES):
            item.add_marker(pytest.mark.long)
