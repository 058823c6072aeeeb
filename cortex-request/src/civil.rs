//! Calendar dates from Unix time, for the timestamps cortex prints and
//! sends (UTC, proleptic Gregorian), with no clock or time-zone crate.

/// The UTC date and time of `seconds` since 1970-01-01:
/// `(year, month 1–12, day 1–31, hour, minute, second)`.
///
/// ```
/// assert_eq!(cortex_request::civil_date(0), (1970, 1, 1, 0, 0, 0));
/// assert_eq!(cortex_request::civil_date(951_782_400 + 3_661), (2000, 2, 29, 1, 1, 1));
/// ```
pub fn civil_date(seconds: i64) -> (i64, u32, u32, u32, u32, u32) {
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month as u32,
        day as u32,
        (rest / 3600) as u32,
        (rest % 3600 / 60) as u32,
        (rest % 60) as u32,
    )
}
