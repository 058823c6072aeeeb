//! The queue's shared driver suite: every case a driver of the cortex queue
//! must pass, written once against [`Queue`](cortex_queue::Queue) and run on each driver.
//!
//! A driver's tests implement [`DriverUnderTest`] (a fresh, empty queue per
//! case, its consistency check, how a child process opens it) and invoke
//! [`queue_suite!`] once, at the root of a test binary:
//!
//! ```text
//! struct MyDriver { /* a fresh queue and a scratch directory */ }
//! impl cortex_queue_suite::DriverUnderTest for MyDriver { /* … */ }
//! cortex_queue_suite::queue_suite!(MyDriver);
//! ```
//!
//! Each case becomes a `#[test]` of that binary. The process cases run the
//! binary again as workers (through the `child_process_entry` test the macro
//! adds), kill them with SIGKILL at the queue's failpoints and stop one as a
//! zombie, so the test build must switch on `cortex-queue`'s `failpoints`
//! feature (a dev-dependency does) and the driver must call
//! `cortex_queue::failpoint::hit` where SQLite's and PostgreSQL's drivers do.
//!
//! Each driver runs it from its own tests (`cortex-queue-sqlite/tests/
//! suite.rs` and `cortex-queue-postgres/tests/suite.rs`), so `cargo test -p
//! cortex-queue-sqlite` runs every case, and so does `cargo test -p
//! cortex-queue-postgres` with `CORTEX_TEST_POSTGRES` naming a server.
//!
//! # Design notes
//!
//! The cases take `&dyn DriverUnderTest`, so they compile once however many
//! drivers a workspace has; what differs between drivers is only what the
//! trait asks. Expected reports are files beside the code (`expected/`), the
//! same for every driver: a report that depended on the store would be a bug.

#![forbid(unsafe_code)]

mod common;
mod driver;
#[doc(hidden)]
pub mod input;
#[doc(hidden)]
pub mod lifecycle;
#[doc(hidden)]
pub mod processes;
mod server;

pub use common::{response_for, submit_prompts, write_prompts};
pub use driver::{DriverUnderTest, FAST_RETRIES};
pub use server::{fresh_database_name, test_server};

/// Every case of the suite as a `#[test]` on the driver `$driver` (a type
/// implementing [`DriverUnderTest`]), plus the entry point of the process
/// cases' children. Invoke it once, at the root of a test binary.
#[macro_export]
macro_rules! queue_suite {
    ($driver:ty) => {
        $crate::queue_suite!(@cases $driver, input:
            all_or_nothing_reports_every_bad_line_and_stores_nothing,
            skip_invalid_keeps_good_lines_and_records_bad_ones_as_failed,
            empty_and_blank_files_are_rejected,
            the_same_file_and_parameters_twice_is_reported_unless_forced,
            a_job_records_its_source_model_defaults_and_metadata,
            a_jobs_shared_grammar_is_stored_once_and_comes_back_with_each_item,
        );
        $crate::queue_suite!(@cases $driver, lifecycle:
            a_job_runs_to_completion_and_exports_openai_batch_output_in_input_order,
            a_lost_lease_cannot_heartbeat_or_write_and_the_new_holder_wins,
            heartbeats_keep_a_lease_alive,
            retryable_failures_back_off_until_max_attempts_then_fail_with_the_last_error,
            a_non_retryable_failure_fails_at_once_and_is_exported_as_an_error,
            a_job_past_its_window_expires_keeping_what_finished,
            a_job_that_ends_has_its_webhook_event_in_the_outbox_until_delivered,
            a_job_that_carries_its_destination_has_an_export_in_the_outbox_when_it_ends,
            a_lone_poison_item_is_charged_only_for_deaths_while_alone,
            lone_suspects_take_turns_and_wait_for_a_workers_later_claim,
            a_lone_suspect_whose_worker_died_waits_before_it_runs_alone_again,
            a_poison_item_among_others_fails_alone_and_costs_the_others_no_attempts,
            cancel_stops_pending_items_at_once_and_running_ones_at_their_heartbeat_then_resume_finishes,
            released_items_are_pending_again_without_using_an_attempt,
            higher_priority_jobs_are_claimed_first_and_claims_can_be_limited_to_jobs,
            a_claim_by_a_worker_whose_outputs_vary_marks_only_its_jobs,
            jobs_belong_to_a_project_and_list_by_it,
            export_refuses_a_running_job_unless_partial_and_never_leaves_half_a_file,
            status_reports_throughput_and_an_eta_while_running,
            status_counts_the_tokens_of_running_items_as_they_are_reported,
            items_page_and_inspect_with_their_runs_and_latencies,
            job_pages_filter_by_model_and_count_every_match,
        );
        $crate::queue_suite!(@cases $driver, processes:
            four_worker_processes_share_a_job_and_no_item_is_claimed_twice,
            kill_9_at_every_failpoint_loses_nothing_and_records_each_result_once,
            a_dead_workers_leases_are_reclaimed_at_once,
            a_stopped_zombie_worker_cannot_heartbeat_or_write_its_stale_result,
        );

        /// The process cases' workers: this binary run again with the
        /// suite's child role set; does nothing in a normal run.
        #[test]
        fn child_process_entry() {
            $crate::processes::child_process_entry(
                <$driver as $crate::DriverUnderTest>::open_location,
            );
        }
    };
    (@cases $driver:ty, $module:ident: $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                if let Some(driver) =
                    <$driver as $crate::DriverUnderTest>::fresh(stringify!($case))
                {
                    $crate::$module::$case(&driver);
                }
            }
        )*
    };
}
