//! The password file parser: any text is either refused with a line number or read into users
//! that write back to a file that reads the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_broker::passwords::Passwords;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Passwords::parse(text, "fuzz") {
        Ok(users) => {
            let again = Passwords::parse(&users.to_text(), "again").expect("written back");
            assert_eq!(again, users);
        }
        Err(e) => assert!(e.to_string().starts_with("fuzz line ")),
    }
});
