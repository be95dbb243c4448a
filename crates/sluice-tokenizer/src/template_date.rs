//! The date a chat template sees. Hugging Face gives templates `strftime_now(format)`, and
//! some print it into the prompt (gpt-oss's system message: `Current date: 2026-12-01`; Llama
//! 3.2's `Today Date: 01 Dec 2026`). The prompt, and so every token the model writes after
//! it, then changes at midnight. A deployment that needs the same prompt tomorrow (an
//! evaluation, a cache keyed by the prompt, a test of what a model answers) pins the date.

use std::fmt;
use std::str::FromStr;

use chrono::{Local, NaiveDate, NaiveDateTime};

/// What `strftime_now` formats: the host's local time now, or a pinned day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TemplateDate {
    /// The local date and time when the template renders (Hugging Face's behaviour).
    #[default]
    Today,
    /// This day at 00:00:00, whatever the clock says: a template that also prints the time
    /// prints midnight, so the whole rendered prompt is fixed.
    Pinned(NaiveDate),
}

impl TemplateDate {
    /// The moment `strftime_now` formats on this call.
    pub fn moment(self) -> NaiveDateTime {
        match self {
            Self::Today => Local::now().naive_local(),
            Self::Pinned(day) => day.and_time(chrono::NaiveTime::MIN),
        }
    }
}

impl FromStr for TemplateDate {
    type Err = String;

    /// `today`, or a day as `YYYY-MM-DD`.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("today") {
            return Ok(Self::Today);
        }
        NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .map(Self::Pinned)
            .map_err(|_| format!("{s:?} is not a date: give YYYY-MM-DD (e.g. 2026-12-01) or today"))
    }
}

impl fmt::Display for TemplateDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Today => f.write_str("today"),
            Self::Pinned(day) => write!(f, "{}", day.format("%Y-%m-%d")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_day_or_today_and_prints_it_back() {
        let day: TemplateDate = "2026-11-28".parse().unwrap();
        assert_eq!(
            day,
            TemplateDate::Pinned(NaiveDate::from_ymd_opt(2026, 11, 28).unwrap())
        );
        assert_eq!(day.to_string(), "2026-11-28");
        assert_eq!(
            "Today".parse::<TemplateDate>().unwrap(),
            TemplateDate::Today
        );
        assert_eq!(TemplateDate::Today.to_string(), "today");
    }

    #[test]
    fn refuses_what_is_not_a_day() {
        for bad in [
            "2026-13-01",
            "2026-02-30",
            "01/12/2026",
            "2026-12-01T10:00:00",
            "",
        ] {
            let err = bad.parse::<TemplateDate>().unwrap_err();
            assert!(err.contains("YYYY-MM-DD"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_pinned_day_is_that_day_at_midnight() {
        let day: TemplateDate = "2027-01-31".parse().unwrap();
        assert_eq!(
            day.moment().format("%Y-%m-%d %H:%M:%S").to_string(),
            "2027-01-31 00:00:00"
        );
    }
}
