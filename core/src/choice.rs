//! Enums whose values have names: the options' choices (`--rotation
//! hadamard`, `"quant_format": "int4"`), the container formats, the
//! simulator's distributions. [`choice_enum!`] defines such an enum once,
//! with each value's name and help beside it; the name is what every door
//! reads and writes (the options schema, JSON, the report, the CLI), so no
//! door can spell a value differently from another.

/// An enum whose values are picked by name.
pub trait Choice: Copy + Eq + 'static {
    /// Every value, in the order the docs list them.
    const ALL: &'static [Self];

    /// The value's name (`fp8-e4m3`).
    fn name(self) -> &'static str;

    /// One line on what the value means (the doc comment of its variant).
    fn help(self) -> &'static str;

    /// The value called `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }

    /// Every name, in order.
    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.name()).collect()
    }

    /// The value called `name`, or the message every door gives.
    fn parse(name: &str) -> Result<Self, String> {
        let name = name.trim();
        Self::from_name(name)
            .ok_or_else(|| format!("\"{name}\" is not one of {}", Self::names().join(", ")))
    }
}

/// Defines an enum of named values: `Variant = "name"`, each with its doc
/// comment (its help; variants take no other attribute, so a default is an
/// `impl Default`). The enum is `Clone, Copy, Debug, PartialEq, Eq, Hash`,
/// implements [`Choice`], shows as its name, and (de)serializes as its
/// name.
#[macro_export]
macro_rules! choice_enum {
    (
        $(#[$attr:meta])*
        $vis:vis enum $ty:ident {
            $(
                $(#[doc = $doc:literal])*
                $variant:ident = $name:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $ty {
            $(
                $(#[doc = $doc])*
                $variant
            ),+
        }

        impl $crate::choice::Choice for $ty {
            const ALL: &'static [Self] = &[$(Self::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }

            fn help(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!($($doc),*).trim_ascii()),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::choice::Choice::name(*self))
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($crate::choice::Choice::name(*self))
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = <String as serde::Deserialize>::deserialize(d)?;
                <Self as $crate::choice::Choice>::parse(&name).map_err(serde::de::Error::custom)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Choice;

    crate::choice_enum! {
        /// A test enum.
        enum Colour {
            /// The first.
            /// On two lines.
            Red = "red",
            Deep = "deep-blue",
        }
    }

    #[test]
    fn names_read_back_and_serialize_as_themselves() {
        assert_eq!(Colour::names(), ["red", "deep-blue"]);
        assert_eq!(Colour::from_name("deep-blue"), Some(Colour::Deep));
        assert_eq!(Colour::Red.help(), "The first. On two lines.");
        assert_eq!(Colour::Deep.help(), "");
        assert_eq!(Colour::Deep.to_string(), "deep-blue");
        assert_eq!(
            serde_json::to_string(&Colour::Deep).unwrap(),
            "\"deep-blue\""
        );
        let back: Colour = serde_json::from_str("\"red\"").unwrap();
        assert_eq!(back, Colour::Red);
        let e = serde_json::from_str::<Colour>("\"green\"").unwrap_err();
        assert!(
            e.to_string()
                .contains("\"green\" is not one of red, deep-blue")
        );
        assert_eq!(
            Colour::parse(" tan").unwrap_err(),
            "\"tan\" is not one of red, deep-blue"
        );
    }
}
