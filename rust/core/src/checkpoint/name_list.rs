//! [`NameList`]: a checkpoint's sorted tensor names in one buffer. A checkpoint of a
//! mixture-of-experts model names some 90,000 tensors; a `String` each cost an allocation at
//! open and a free at drop, which was a tenth of opening the index.

use std::fmt;
use std::ops::Index;

/// Names held back to back in one buffer, by position.
///
/// ```
/// use safetensors_core::NameList;
/// let names: NameList = ["a.weight", "b.bias"].into_iter().collect();
/// assert_eq!(names.len(), 2);
/// assert_eq!(&names[1], "b.bias");
/// assert_eq!(names.get(2), None);
/// assert_eq!(names.iter().collect::<Vec<_>>(), ["a.weight", "b.bias"]);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NameList {
    text: String,
    /// Where each name ends in `text`; name `i` starts where name `i - 1` ends.
    ends: Vec<usize>,
}

impl NameList {
    /// Room for `names` names of `bytes` bytes together.
    pub(crate) fn with_capacity(names: usize, bytes: usize) -> NameList {
        NameList {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(names),
        }
    }

    /// Appends `name`.
    pub(crate) fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Name `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1],
        };
        self.text.get(start..end)
    }

    /// The names in order.
    pub fn iter(&self) -> NameIter<'_> {
        NameIter {
            list: self,
            at: 0..self.len(),
        }
    }

    /// The names as owned strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

impl Index<usize> for NameList {
    type Output = str;

    /// Name `i`; panics past the end, as a slice does.
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(name) => name,
            None => panic!("name {i} of a list of {}", self.len()),
        }
    }
}

impl<'a> FromIterator<&'a str> for NameList {
    fn from_iter<I: IntoIterator<Item = &'a str>>(names: I) -> NameList {
        let mut out = NameList::default();
        for name in names {
            out.push(name);
        }
        out
    }
}

impl<'a> IntoIterator for &'a NameList {
    type Item = &'a str;
    type IntoIter = NameIter<'a>;

    fn into_iter(self) -> NameIter<'a> {
        self.iter()
    }
}

/// The names of a [`NameList`], in order ([`NameList::iter`]).
#[derive(Clone, Debug)]
pub struct NameIter<'a> {
    list: &'a NameList,
    at: std::ops::Range<usize>,
}

impl<'a> Iterator for NameIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        self.at.next().map(|i| &self.list[i])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.at.size_hint()
    }
}

impl DoubleEndedIterator for NameIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.at.next_back().map(|i| &self.list[i])
    }
}

impl ExactSizeIterator for NameIter<'_> {}

impl fmt::Debug for NameList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for NameList {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for NameList {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for &NameList {
    fn eq(&self, other: &[S; N]) -> bool {
        **self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for NameList {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}
